//! Assembles a kernel's source from the prelude, its family templates (each family's `.cu`
//! beside its `cuda.rs`), generated `Cfg` structs of compile-time constants and an
//! `extern "C"` entry wrapper.

use super::KernelParam;

/// `kernels/prelude.cuh`: element types, fp32 load/store helpers, compile-time shapes and
/// block reductions that every template uses.
pub(crate) const PRELUDE: &str = include_str!("../../kernels/prelude.cuh");

/// A generated CUDA kernel ready for NVRTC.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    /// `family_<hash of source>`: equal names mean byte-identical sources.
    pub name: String,
    /// Complete CUDA C++ translation unit (prelude, templates, constants, entry wrapper).
    pub source: String,
    /// The `extern "C" __global__` function to launch.
    pub entry: String,
    /// Grid dimensions to launch with.
    pub grid: [u32; 3],
    /// Block dimensions to launch with (the entry carries matching `__launch_bounds__`).
    pub block: [u32; 3],
    /// Dynamic shared memory bytes to launch with (the templates use only static
    /// `__shared__` storage, so this is 0 for every current kernel).
    pub shared_bytes: u32,
    /// The entry's arguments in order: `Arena` first, then offsets and scalars.
    pub params: Vec<KernelParam>,
    /// The grid of a second, finishing launch of the same entry (same block, same arguments
    /// but [`KernelParam::Phase`] 1), issued right after the first in stream order: the
    /// two-stage reductions sum their per-block partials there in a fixed order. `None`: one
    /// launch.
    pub finish: Option<[u32; 3]>,
    /// The tensor table the host writes at the start of the step's workspace before the
    /// launch, when the kernel reads a list of inputs through it instead of one argument each.
    pub table: Option<TensorTable>,
    /// The library calls the step makes instead of the plain launch (empty: launch `grid`,
    /// then `finish`). A kernel whose `source` is empty is library calls alone.
    pub library: Vec<super::gemm::Call>,
    /// Byte offset in the step's workspace where the library's scratch begins (the
    /// kernel's own scratch lies before it).
    pub library_workspace_from: u64,
}

impl Kernel {
    /// A step made of library calls alone (no generated code): `family_<hash of the calls>`.
    pub(crate) fn library_only(family: &str, calls: Vec<super::gemm::Call>) -> Kernel {
        let described = format!("{calls:?}");
        Kernel {
            name: format!("{family}_{:016x}", fnv1a(&described)),
            source: String::new(),
            entry: String::new(),
            grid: [0, 0, 0],
            block: [0, 0, 0],
            shared_bytes: 0,
            params: vec![KernelParam::Arena],
            finish: None,
            table: None,
            library: calls,
            library_workspace_from: 0,
        }
    }

    /// The kernel run as `calls` (its own launches among them), the library's scratch
    /// starting `scratch_from` bytes into the workspace; renamed for its calls too.
    pub(crate) fn with_library(
        mut self,
        calls: Vec<super::gemm::Call>,
        scratch_from: u64,
    ) -> Kernel {
        let described = format!("{}{calls:?}{scratch_from}", self.source);
        self.name = format!(
            "{}_{:016x}",
            self.entry.trim_start_matches("memc_"),
            fnv1a(&described)
        );
        self.library = calls;
        self.library_workspace_from = scratch_from;
        self
    }

    /// Whether the step has generated code to compile and launch.
    pub fn has_code(&self) -> bool {
        !self.source.is_empty()
    }
}

/// Inputs a kernel reads through a table in its workspace rather than as arguments, so that
/// its argument list stays the same size however many tensors it reads (CUDA before 12.1
/// caps kernel arguments at 4 KiB).
///
/// The table is `3 x 8` bytes per input, little-endian `u64`s: the input's arena byte
/// offset, the index of its first element in the flat index space of all the inputs in
/// table order, and its element type (0 f32, 1 f16, 2 bf16, 3 i32). [`TensorTable::bytes`]
/// renders it; the kernel's workspace begins with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorTable {
    /// (input index, element count, type code) per row, in table order.
    rows: Vec<(usize, u64, u64)>,
}

impl TensorTable {
    /// Bytes one table row takes.
    pub const ROW_BYTES: u64 = 24;

    /// The table of `inputs` (indices into the op's inputs) of the given element counts and
    /// types, in this order.
    pub(crate) fn new(inputs: impl IntoIterator<Item = (usize, u64, crate::ir::DType)>) -> Self {
        use crate::ir::DType;
        let code = |d| match d {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::I32 => 3,
            DType::U8 => 4,
        };
        TensorTable {
            rows: inputs
                .into_iter()
                .map(|(i, n, d)| (i, n, code(d)))
                .collect(),
        }
    }

    /// The table's size in bytes: [`TensorTable::ROW_BYTES`] per input.
    pub fn len_bytes(&self) -> u64 {
        self.rows.len() as u64 * Self::ROW_BYTES
    }

    /// The op input indices the table lists, in table order.
    pub fn inputs(&self) -> impl Iterator<Item = usize> + '_ {
        self.rows.iter().map(|r| r.0)
    }

    /// The table's bytes, given each listed input's arena byte offset (`offset(i)` for op
    /// input `i`).
    pub fn bytes(&self, offset: impl Fn(usize) -> u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len_bytes() as usize);
        let mut start = 0u64;
        for &(i, n, code) in &self.rows {
            for v in [offset(i), start, code] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            start += n;
        }
        out
    }
}

/// The line that separates a kernel's shared templates from its own constants and entry.
pub(crate) const GENERATED: &str = "\n// ---- generated constants ----\n";

/// Most blocks a grid-stride kernel launches along x.
const MAX_GRID_X: u64 = 1 << 20;

/// Kernel under construction.
pub(crate) struct Gen {
    family: &'static str,
    files: Vec<&'static str>,
    globals: Vec<String>,
    cfgs: Vec<(String, Vec<String>)>,
    body: Vec<String>,
    params: Vec<KernelParam>,
    grid: [u32; 3],
    block: [u32; 3],
    finish_grid: Option<[u32; 3]>,
    table: Option<TensorTable>,
}

/// `static constexpr unsigned long long NAME = V;`
pub(crate) fn c_u64(name: &str, v: u64) -> String {
    format!("static constexpr u64 {name} = {v}ull;")
}

/// `static constexpr bool NAME = V;`
pub(crate) fn c_bool(name: &str, v: bool) -> String {
    format!("static constexpr bool {name} = {v};")
}

/// `static constexpr int NAME = V;`
pub(crate) fn c_int(name: &str, v: i64) -> String {
    format!("static constexpr int {name} = {v};")
}

/// A float literal NVRTC accepts in a constant expression, including inf and NaN.
pub(crate) fn f32_lit(v: f32) -> String {
    if v.is_nan() {
        "__builtin_nanf(\"\")".to_string()
    } else if v.is_infinite() {
        if v > 0.0 {
            "__builtin_huge_valf()".to_string()
        } else {
            "(-__builtin_huge_valf())".to_string()
        }
    } else {
        format!("{v:e}f")
    }
}

/// `static constexpr float NAME = V;`
pub(crate) fn c_f32(name: &str, v: f32) -> String {
    format!("static constexpr float {name} = {};", f32_lit(v))
}

/// `using NAME = Dims<...>;`
pub(crate) fn c_dims(name: &str, dims: &[u64]) -> String {
    let list: Vec<String> = dims.iter().map(|d| format!("{d}ull")).collect();
    format!("using {name} = Dims<{}>;", list.join(", "))
}

/// `using NAME = T;` for an element type.
pub(crate) fn c_type(name: &str, ty: &str) -> String {
    format!("using {name} = {ty};")
}

/// The 64-bit FNV-1a hash of `text`: stable across runs and builds.
pub(crate) fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

impl Gen {
    /// A kernel of `family` built from the given template files (prelude implied).
    pub(crate) fn new(family: &'static str, files: &[&'static str]) -> Gen {
        Gen {
            family,
            files: files.to_vec(),
            globals: Vec::new(),
            cfgs: Vec::new(),
            body: Vec::new(),
            params: vec![KernelParam::Arena],
            grid: [1, 1, 1],
            block: [256, 1, 1],
            finish_grid: None,
            table: None,
        }
    }

    /// Adds a generated namespace-scope declaration (e.g. a `__device__` table) before the
    /// constants.
    pub(crate) fn global(&mut self, text: String) {
        self.globals.push(text);
    }

    /// Adds a `struct NAME { lines };` of constants.
    pub(crate) fn cfg(&mut self, name: &str, lines: Vec<String>) {
        self.cfgs.push((name.to_string(), lines));
    }

    /// Adds a statement to the entry body (arguments are named `arena`, `in<i>`, `out`,
    /// `step`).
    pub(crate) fn call(&mut self, stmt: String) {
        self.body.push(stmt);
    }

    /// Appends entry arguments after the arena pointer.
    pub(crate) fn params(&mut self, params: &[KernelParam]) {
        self.params.extend_from_slice(params);
    }

    /// Sets the launch geometry.
    pub(crate) fn launch(&mut self, grid: [u64; 3], block: u32) {
        self.grid = grid.map(|g| clamp_u32(g.max(1)));
        self.block = [block, 1, 1];
    }

    /// Adds a finishing launch over `grid` blocks (see [`Kernel::finish`]).
    pub(crate) fn finish_over(&mut self, grid: u64) {
        self.finish_grid = Some([clamp_u32(grid.max(1)), 1, 1]);
    }

    /// Makes the kernel read the inputs of `table` through its workspace.
    pub(crate) fn table(&mut self, table: TensorTable) {
        self.table = Some(table);
    }

    /// A grid-stride elementwise launch over `n` items, 256 threads a block.
    pub(crate) fn elementwise(&mut self, n: u64) {
        self.launch([n.div_ceil(256).min(MAX_GRID_X), 1, 1], 256);
    }

    /// One block per item (grid-stride over items), `block` threads a block.
    pub(crate) fn per_block(&mut self, items: u64, block: u32) {
        self.launch([items.min(MAX_GRID_X), 1, 1], block);
    }

    /// Renders the source and names the kernel.
    pub(crate) fn finish(self) -> Kernel {
        let entry = format!("memc_{}", self.family);
        let mut src = String::with_capacity(16 * 1024);
        src.push_str(PRELUDE);
        for f in &self.files {
            src.push('\n');
            src.push_str(f);
        }
        src.push_str(GENERATED);
        for g in &self.globals {
            src.push_str(g);
        }
        for (name, lines) in &self.cfgs {
            src.push_str(&format!("struct {name} {{\n"));
            for l in lines {
                src.push_str("    ");
                src.push_str(l);
                src.push('\n');
            }
            src.push_str("};\n");
        }
        let args: Vec<String> = self
            .params
            .iter()
            .map(|p| match p {
                KernelParam::Arena => "char* arena".to_string(),
                KernelParam::Input(i) => format!("u64 in{i}"),
                KernelParam::Output => "u64 out".to_string(),
                KernelParam::Step => "u64 step".to_string(),
                KernelParam::MicroStep => "u64 micro".to_string(),
                KernelParam::Stream => "u64 stream".to_string(),
                KernelParam::Workspace => "u64 ws".to_string(),
                KernelParam::Phase => "u64 phase".to_string(),
                KernelParam::Chunk => "u64 chunk".to_string(),
            })
            .collect();
        let threads = self.block[0] * self.block[1] * self.block[2];
        src.push_str(&format!(
            "extern \"C\" __global__ void __launch_bounds__({threads}) {entry}({}) {{\n",
            args.join(", ")
        ));
        for stmt in &self.body {
            src.push_str(&format!("    {stmt};\n"));
        }
        src.push_str("}\n");
        Kernel {
            name: format!("{}_{:016x}", self.family, fnv1a(&src)),
            source: src,
            entry,
            grid: self.grid,
            block: self.block,
            shared_bytes: 0,
            params: self.params,
            finish: self.finish_grid,
            table: self.table,
            library: Vec::new(),
            library_workspace_from: 0,
        }
    }
}
