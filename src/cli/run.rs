pub fn run(_a: RunArgs) -> Result<(), super::Failure> { Ok(()) }
#[derive(clap::Args)] pub struct RunArgs { file: std::path::PathBuf }
