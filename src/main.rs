//! The memc command line: a thin layer over the library; the only place that prints.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
