//! Assembles a kernel's source from the prelude, its family templates (each family's `.cu`
//! beside its `cuda.rs`), generated `Cfg` structs of compile-time constants and an
//! `extern "C"` entry wrapper.

use super::KernelParam;

/// `kernels/prelude.cuh`: element types, fp32 load/store helpers, compile-time shapes and
/// block reductions that every template uses.
pub(crate) const PRELUDE: &str = include_str!("../../kernels/prelude.cuh");

/// A generated CUDA kernel ready for NVRTC.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

/// The line that separates a kernel's shared templates from its own constants and entry.
pub(crate) const GENERATED: &str = "\n// ---- generated constants ----\n";

/// Most blocks a grid-stride kernel launches along x.
const MAX_GRID_X: u64 = 1 << 20;

/// Kernel under construction.
pub(crate) struct Gen {
    family: &'static str,
    files: Vec<&'static str>,
    cfgs: Vec<(String, Vec<String>)>,
    body: Vec<String>,
    params: Vec<KernelParam>,
    grid: [u32; 3],
    block: [u32; 3],
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

fn fnv1a(text: &str) -> u64 {
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
            cfgs: Vec::new(),
            body: Vec::new(),
            params: vec![KernelParam::Arena],
            grid: [1, 1, 1],
            block: [256, 1, 1],
        }
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
        }
    }
}
