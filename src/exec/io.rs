//! npy/safetensors
