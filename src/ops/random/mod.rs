//! Dropout with a counter-based mask that recomputation reproduces.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The random family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// `rng.cu`: the splitmix64 counter RNG (`memc_hash`, `memc_uniform01`, `memc_bits`, equal
/// bit for bit to [`crate::exec::kernels::rng`]) and the inverted-dropout template; other
/// families' kernels that draw random bits include it.
pub(crate) const RNG_CU: &str = include_str!("rng.cu");
