//! Target devices.

use std::fmt;

/// Where a graph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host CPU (always built by default).
    Cpu,
    /// Apple Metal.
    Metal,
    /// Apple MLX.
    Mlx,
    /// Apple Neural Engine.
    Ane,
    /// NVIDIA CUDA.
    Cuda,
    /// AMD ROCm.
    Rocm,
    /// Google TPU.
    Tpu,
    /// Any GPU through wgpu.
    Gpu,
    /// Vulkan through wgpu.
    Vulkan,
    /// OpenGL through wgpu.
    OpenGl,
    /// DirectX 12 through wgpu.
    DirectX,
    /// WebGPU through wgpu.
    WebGpu,
}

impl Device {
    /// Every device variant.
    pub const ALL: [Device; 12] = [
        Device::Cpu,
        Device::Metal,
        Device::Mlx,
        Device::Ane,
        Device::Cuda,
        Device::Rocm,
        Device::Tpu,
        Device::Gpu,
        Device::Vulkan,
        Device::OpenGl,
        Device::DirectX,
        Device::WebGpu,
    ];

    /// The cargo feature of the `rlx` crate that builds this device's backend.
    pub fn feature(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Metal => "metal",
            Device::Mlx => "mlx",
            Device::Ane => "ane",
            Device::Cuda => "cuda",
            Device::Rocm => "rocm",
            Device::Tpu => "tpu",
            Device::Gpu | Device::Vulkan | Device::OpenGl | Device::DirectX | Device::WebGpu => {
                "gpu"
            }
        }
    }

    /// Whether graphs can run on the device: a backend is registered for it, or it is built in
    /// (for the wgpu devices: the `gpu` feature, and an adapter of that kind exists; see
    /// [`crate::gpu::adapter`]).
    pub fn is_available(self) -> bool {
        if crate::registered_backend(self).is_some() {
            return true;
        }
        match self {
            Device::Cpu => cfg!(feature = "cpu"),
            #[cfg(feature = "cuda")]
            Device::Cuda => crate::cuda::devices().is_ok(),
            #[cfg(feature = "gpu")]
            Device::Gpu | Device::Vulkan | Device::DirectX | Device::OpenGl | Device::WebGpu => {
                crate::gpu::available(self)
            }
            _ => false,
        }
    }

    /// Whether the backend is compiled into this build through a cargo feature (for the wgpu
    /// devices, whether an adapter exists is another question: see [`Device::is_available`]).
    pub fn is_built_in(self) -> bool {
        match self {
            Device::Cpu => cfg!(feature = "cpu"),
            Device::Gpu | Device::Vulkan | Device::DirectX | Device::OpenGl | Device::WebGpu => {
                cfg!(feature = "gpu")
            }
            Device::Cuda => cfg!(feature = "cuda"),
            Device::Metal | Device::Mlx | Device::Ane | Device::Rocm | Device::Tpu => false,
        }
    }

    /// What a user should do to get this device, for error messages.
    pub fn availability_hint(self) -> String {
        if self == Device::Cpu {
            "enable the `cpu` feature of `rlx` (it is on by default)".to_string()
        } else if self == Device::Cuda && self.is_built_in() {
            #[cfg(feature = "cuda")]
            if let Err(why) = crate::cuda::devices() {
                return why;
            }
            "a CUDA device is present".to_string()
        } else if self.is_built_in() {
            format!("no {self:?} adapter found; on Linux without a GPU, install Mesa's software Vulkan (`apt-get install mesa-vulkan-drivers`); `RLX_WGPU_ADAPTER` picks an adapter by name")
        } else {
            format!(
                "this version of RLX has no {self:?} backend yet (it will be behind the `{}` feature); use Device::Cpu, or register a backend with rlx::driver::register_backend",
                self.feature()
            )
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}
