//! cuBLASLt behind the CUDA executor: one handle, and each [`Gemm`] of the plan prepared once
//! (descriptors, layouts and the heuristic's algorithm for its workspace and alignments) so a
//! step only issues `cublasLtMatmul` on the stream. The workspace is the step's planned arena
//! buffer; cuBLASLt allocates nothing. The library loads at run time (`libcublasLt.so`, from
//! the CUDA toolkit or PyTorch's nvidia-cublas wheel); missing, it is a device error naming it.

use super::ExecError;
use crate::codegen::gemm::{Epilogue, Gemm, Matrix};
use crate::ir::DType;
use cudarc::cublaslt::{result, sys};
use std::ffi::c_void;

fn lt_error(what: &str, e: result::CublasError) -> ExecError {
    ExecError::Device(format!("cuBLASLt {what}: {e:?}"))
}

/// True when libcublasLt can be loaded.
pub fn cublaslt_present() -> bool {
    // SAFETY: only tries to open the library with libloading; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// An open cuBLASLt handle.
pub struct Lt {
    handle: sys::cublasLtHandle_t,
}

impl Lt {
    /// Opens cuBLASLt, or a device error naming the missing library.
    pub fn new() -> Result<Lt, ExecError> {
        if !cublaslt_present() {
            return Err(ExecError::Device(
                "cuBLASLt not found: libcublasLt.so is on no library path (it ships with the CUDA toolkit's lib64 and PyTorch's nvidia-cublas wheel; put its folder on LD_LIBRARY_PATH)".to_string(),
            ));
        }
        let handle = result::create_handle().map_err(|e| lt_error("create", e))?;
        Ok(Lt { handle })
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `Lt::new` and is destroyed once.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

fn data_type(d: DType) -> Result<sys::cudaDataType, ExecError> {
    match d {
        DType::F32 => Ok(sys::cudaDataType::CUDA_R_32F),
        DType::F16 => Ok(sys::cudaDataType::CUDA_R_16F),
        DType::BF16 => Ok(sys::cudaDataType::CUDA_R_16BF),
        DType::I32 | DType::U8 => Err(ExecError::Unsupported(format!("matmul of {d} operands"))),
    }
}

/// One GEMM ready to issue: its descriptors, algorithm and device addresses.
pub struct PreparedGemm {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
    ptrs: [u64; 3],
    workspace: (u64, usize),
    alpha: f32,
    beta: f32,
}

/// The largest power of two (up to 256) dividing `addr`: the alignment cuBLASLt may assume.
fn alignment(addr: u64) -> u32 {
    1u32 << addr.trailing_zeros().min(8)
}

fn layout(m: &Matrix, batch: u64) -> Result<sys::cublasLtMatrixLayout_t, ExecError> {
    let l = result::create_matrix_layout(data_type(m.dtype)?, m.rows, m.cols, m.ld as i64)
        .map_err(|e| lt_error("layout", e))?;
    let count =
        i32::try_from(batch).map_err(|_| ExecError::Unsupported(format!("GEMM batch {batch}")))?;
    let stride = m.stride as i64;
    // SAFETY: `l` is a live layout; each value is the attribute's documented type.
    unsafe {
        result::set_matrix_layout_attribute(
            l,
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            (&count) as *const i32 as *const c_void,
            4,
        )
        .map_err(|e| lt_error("batch count", e))?;
        result::set_matrix_layout_attribute(
            l,
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            (&stride) as *const i64 as *const c_void,
            8,
        )
        .map_err(|e| lt_error("batch stride", e))?;
    }
    Ok(l)
}

/// Sets `g`'s epilogue on `desc`, its vector at device address `at`, in D's type (the
/// default bias type), the same for every batch item: the bias added, or the bias gradient
/// stored (`CUBLASLT_EPILOGUE_BGRADA`: `op(A)`'s rows summed over `k`).
///
/// # Safety
/// `desc` must be a live matmul descriptor.
unsafe fn set_epilogue(
    desc: sys::cublasLtMatmulDesc_t,
    g: &Gemm,
    at: u64,
) -> Result<(), ExecError> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    let epilogue = match g.epilogue {
        Epilogue::BiasGrad(_) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BGRADA,
        _ => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
    };
    let stride = 0i64;
    result::set_matmul_desc_attribute(
        desc,
        A::CUBLASLT_MATMUL_DESC_EPILOGUE,
        (&epilogue) as *const sys::cublasLtEpilogue_t as *const c_void,
        std::mem::size_of::<sys::cublasLtEpilogue_t>(),
    )
    .map_err(|e| lt_error("bias epilogue", e))?;
    result::set_matmul_desc_attribute(
        desc,
        A::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
        (&at) as *const u64 as *const c_void,
        8,
    )
    .map_err(|e| lt_error("bias pointer", e))?;
    result::set_matmul_desc_attribute(
        desc,
        A::CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
        (&stride) as *const i64 as *const c_void,
        8,
    )
    .map_err(|e| lt_error("bias batch stride", e))
}

impl Lt {
    /// Prepares `g` with its operands at the device addresses `ptrs` (A, B, D), its
    /// epilogue's vector (if any) at `vector` and the workspace `(address, bytes)`: the heuristic's first algorithm
    /// for these shapes, types, alignments, epilogue and workspace. Errors when cuBLASLt
    /// supports no algorithm for them.
    pub fn prepare(
        &self,
        g: &Gemm,
        ptrs: [u64; 3],
        vector: Option<u64>,
        workspace: (u64, usize),
    ) -> Result<PreparedGemm, ExecError> {
        let desc = result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| lt_error("descriptor", e))?;
        let op = |t: bool| i32::from(t);
        let layouts = [
            layout(&g.a, g.batch)?,
            layout(&g.b, g.batch)?,
            layout(&g.d, g.batch)?,
        ];
        let pref = result::create_matmul_pref().map_err(|e| lt_error("preference", e))?;
        let ws = workspace.1 as u64;
        // SAFETY: every handle is live; each value is the attribute's documented type and
        // size; the layouts, descriptor and preference outlive the heuristic query.
        let algo = unsafe {
            for (attr, t) in [
                (
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                    op(g.trans_a),
                ),
                (
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                    op(g.trans_b),
                ),
            ] {
                result::set_matmul_desc_attribute(
                    desc,
                    attr,
                    (&t) as *const i32 as *const c_void,
                    4,
                )
                .map_err(|e| lt_error("transpose", e))?;
            }
            if let Some(at) = vector {
                set_epilogue(desc, g, at)?;
            }
            result::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const u64 as *const c_void,
                8,
            )
            .map_err(|e| lt_error("workspace", e))?;
            use sys::cublasLtMatmulPreferenceAttributes_t as P;
            let aligned = [
                (
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    alignment(ptrs[0]),
                ),
                (
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    alignment(ptrs[1]),
                ),
                (
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    alignment(ptrs[2]),
                ),
                (
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                    alignment(ptrs[2]),
                ),
            ];
            for (attr, bytes) in aligned {
                result::set_matmul_pref_attribute(
                    pref,
                    attr,
                    (&bytes) as *const u32 as *const c_void,
                    4,
                )
                .map_err(|e| lt_error("alignment", e))?;
            }
            let found = result::get_matmul_algo_heuristic(
                self.handle,
                desc,
                layouts[0],
                layouts[1],
                layouts[2],
                layouts[2],
                pref,
            );
            let _ = result::destroy_matmul_pref(pref);
            found
                .map_err(|e| {
                    lt_error(
                        &format!(
                            "no algorithm for {}x{}x{} (batch {}, {:?} x {:?} -> {:?})",
                            g.m(),
                            g.n(),
                            g.k(),
                            g.batch,
                            g.a.dtype,
                            g.b.dtype,
                            g.d.dtype
                        ),
                        e,
                    )
                })?
                .algo
        };
        Ok(PreparedGemm {
            desc,
            layouts,
            algo,
            ptrs,
            workspace,
            alpha: g.alpha,
            beta: g.beta,
        })
    }

    /// Issues `g` on `stream` (a `CUstream`).
    ///
    /// # Safety
    /// The addresses `g` was prepared with must still be live device memory of the
    /// stream's context, large enough for its operands.
    pub unsafe fn run(&self, g: &PreparedGemm, stream: *mut c_void) -> Result<(), ExecError> {
        let [a, b, d] = g.ptrs;
        result::matmul(
            self.handle,
            g.desc,
            (&g.alpha) as *const f32 as *const c_void,
            (&g.beta) as *const f32 as *const c_void,
            a as *const c_void,
            g.layouts[0],
            b as *const c_void,
            g.layouts[1],
            d as *const c_void,
            g.layouts[2],
            d as *mut c_void,
            g.layouts[2],
            &g.algo,
            g.workspace.0 as *mut c_void,
            g.workspace.1,
            stream as sys::cudaStream_t,
        )
        .map_err(|e| lt_error("matmul", e))
    }
}

impl Drop for PreparedGemm {
    fn drop(&mut self) {
        // SAFETY: the descriptors were created by `Lt::prepare` and are destroyed once.
        unsafe {
            let _ = result::destroy_matmul_desc(self.desc);
            for l in self.layouts {
                let _ = result::destroy_matrix_layout(l);
            }
        }
    }
}
