//! attn-kernels: placeholder, being written.
pub mod cpu;
