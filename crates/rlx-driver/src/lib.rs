//! RLX driver layer: the [`Device`] enum, the narrow [`Backend`] / [`Executable`] traits every
//! backend implements, and a registry for backends built outside the workspace.
//!
//! `Device::is_available()` answers for the backends compiled into this build (through cargo
//! features) and for those registered at run time with [`register_backend`].

#![deny(missing_docs)]

mod backend;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod kernels;
pub mod views;

pub use backend::{
    byte_length_error, register_backend, registered_backend, Backend, CompileOptions, Executable,
    IoSlot,
};
pub use device::Device;
