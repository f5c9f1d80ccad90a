//! Kernel shapes shared by the lowerings: one `Cfg` struct and one entry statement
//! ([`single`]), the common `template<types, Cfg>(arena, in0, .., out)` form ([`templated`]),
//! and the launch geometries ([`Launch`], [`gemm_launch`]).

use super::build::{c_u64, Gen};
use super::geometry::{pow2_block, slices};
use super::ops::Args;
use super::{CodegenError, Kernel, KernelParam};

/// How a kernel is launched: the `Gen` method of the same name, or `Gen::launch`.
pub(crate) enum Launch {
    /// Grid-stride over this many elements, 256 threads a block.
    Elementwise(u64),
    /// One block per item (items, threads a block).
    PerBlock(u64, u32),
    /// An explicit grid and block size.
    Grid([u64; 3], u32),
}

/// A kernel with one `Cfg` struct of `lines` and the one entry statement `call`, taking
/// `params` after the arena, built from the template sources `files` (prelude implied).
pub(crate) fn single(
    family: &'static str,
    files: &[&'static str],
    lines: Vec<String>,
    call: String,
    params: &[KernelParam],
    launch: Launch,
) -> Kernel {
    let mut k = Gen::new(family, files);
    k.cfg("Cfg", lines);
    k.call(call);
    k.params(params);
    match launch {
        Launch::Elementwise(n) => k.elementwise(n),
        Launch::PerBlock(items, block) => k.per_block(items, block),
        Launch::Grid(grid, block) => k.launch(grid, block),
    }
    k.finish()
}

/// A two-stage reduction ([`super::Kernel::finish`]): [`single`] with the workspace and the
/// phase appended to `params` (entry arguments `ws`, `phase`), launched over `grid` blocks
/// of `block` threads, then once more over `finish` blocks.
pub(crate) fn two_stage(
    family: &'static str,
    files: &[&'static str],
    lines: Vec<String>,
    call: String,
    params: &[KernelParam],
    (grid, block): ([u64; 3], u32),
    finish: u64,
) -> Kernel {
    let mut k = Gen::new(family, files);
    k.cfg("Cfg", lines);
    k.call(call);
    k.params(params);
    k.params(&[KernelParam::Workspace, KernelParam::Phase]);
    k.launch(grid, block);
    k.finish_over(finish);
    k.finish()
}

/// A reduction over `groups` groups of `gsize` elements that [`slices`] splits where the
/// groups are too few to fill an H100: unsplit, [`single`] with a block of
/// `pow2_block(gsize, 32, max_block)` threads per group, the workspace and phase passed as 0;
/// split, [`two_stage`] with a block per slice, then `finish(slices, block)` blocks. `lines`
/// gain `SLICES` and `SLICE`; `call` is the entry statement without its last two arguments
/// (`ws`, `phase`) and closing parenthesis.
pub(crate) fn sliced(
    (family, files): (&'static str, &[&'static str]),
    mut lines: Vec<String>,
    call: String,
    params: &[KernelParam],
    (groups, gsize, max_block): (u64, u64, u32),
    finish: impl Fn(u64, u32) -> u64,
) -> Kernel {
    let (n, len) = slices(groups, gsize);
    lines.push(c_u64("SLICES", n));
    lines.push(c_u64("SLICE", len));
    let block = pow2_block(len, 32, max_block);
    if n == 1 {
        let launch = Launch::PerBlock(groups, block);
        return single(
            family,
            files,
            lines,
            format!("{call}, 0, 0)"),
            params,
            launch,
        );
    }
    two_stage(
        family,
        files,
        lines,
        format!("{call}, ws, phase)"),
        params,
        ([groups * n, 1, 1], block),
        finish(n, block),
    )
}

/// The kernel of a step made of library calls and launches of its own stages: `single` with
/// the statement `template<ty, Cfg>(arena, in0, .., out, ws, phase, chunk)` over the first
/// `n_in` inputs, for `entry = (template, ty, n_in)`; its launches come from its calls
/// ([`super::gemm::Call::Launch`]), each `block` threads a block.
pub(crate) fn staged(
    family: &'static str,
    files: &[&'static str],
    lines: Vec<String>,
    (template, ty, n_in): (&str, &str, usize),
    block: u32,
) -> Kernel {
    let mut args = in_names(n_in);
    args.extend(["out", "ws", "phase", "chunk"].map(String::from));
    let mut params: Vec<KernelParam> = (0..n_in).map(KernelParam::Input).collect();
    params.extend([
        KernelParam::Output,
        KernelParam::Workspace,
        KernelParam::Phase,
        KernelParam::Chunk,
    ]);
    let call = format!("{template}<{ty}, Cfg>(arena, {})", args.join(", "));
    single(
        family,
        files,
        lines,
        call,
        &params,
        Launch::Grid([1, 1, 1], block),
    )
}

/// Entry arguments `in0` .. `in{n-1}`.
pub(crate) fn in_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("in{i}")).collect()
}

/// [`single`] whose statement is `template<types, Cfg>(arena, in0, .., out)` over the first
/// `n_in` inputs, for `entry = (template, types, n_in)`.
pub(crate) fn templated(
    family: &'static str,
    files: &[&'static str],
    lines: Vec<String>,
    (template, types, n_in): (&str, &[&str], usize),
    launch: Launch,
) -> Kernel {
    let mut args = in_names(n_in);
    args.push("out".to_string());
    let mut params: Vec<KernelParam> = (0..n_in).map(KernelParam::Input).collect();
    params.push(KernelParam::Output);
    let call = format!(
        "{template}<{}, Cfg>(arena, {})",
        types.join(", "),
        args.join(", ")
    );
    single(family, files, lines, call, &params, launch)
}

/// Output tile edge of the GEMM templates (`matmul.cu`, `conv.cu`).
const GEMM_TILE: u64 = 64;

/// The tiled GEMM's output tiles along `n` and along `m` for an `m` x `n` output.
pub(crate) fn gemm_tiles(m: u64, n: u64) -> (u64, u64) {
    (n.div_ceil(GEMM_TILE), m.div_ceil(GEMM_TILE))
}

/// The tiled GEMM launch for an `m` x `n` output per batch; `Unsupported` when the grid
/// exceeds CUDA's limits.
pub(crate) fn gemm_launch(a: &Args, m: u64, n: u64, batch: u64) -> Result<Launch, CodegenError> {
    let (gx, gy) = gemm_tiles(m, n);
    if gx > u64::from(u32::MAX >> 1) || gy > 65535 || batch > 65535 {
        return Err(a.unsupported(format!(
            "GEMM grid {gx} x {gy} x {batch} exceeds CUDA limits"
        )));
    }
    Ok(Launch::Grid([gx, gy, batch], 256))
}
