//! Adapters of the wgpu devices: which wgpu backends a [`Device`] means, and the adapter it
//! gets (`RLX_WGPU_ADAPTER=<part of a name>` picks one by name; `WGPU_BACKEND` narrows the
//! backends of [`Device::Gpu`]).

use crate::Device;
use std::sync::OnceLock;

/// The wgpu backends a device stands for (`None`: not a wgpu device).
pub fn backends(device: Device) -> Option<wgpu::Backends> {
    Some(match device {
        Device::Gpu => wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY),
        Device::Vulkan => wgpu::Backends::VULKAN,
        Device::DirectX => wgpu::Backends::DX12,
        Device::OpenGl => wgpu::Backends::GL,
        Device::WebGpu => wgpu::Backends::BROWSER_WEBGPU,
        Device::Cpu
        | Device::Metal
        | Device::Mlx
        | Device::Ane
        | Device::Cuda
        | Device::Rocm
        | Device::Tpu => return None,
    })
}

/// The adapter `device` runs on: the one whose name contains `RLX_WGPU_ADAPTER` when set, else
/// wgpu's choice (high performance). An error says what was found.
pub fn adapter(device: Device) -> Result<wgpu::Adapter, String> {
    let backends = backends(device).ok_or_else(|| format!("{device:?} is not a wgpu device"))?;
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = backends;
    let instance = wgpu::Instance::new(desc);
    let adapters = pollster::block_on(instance.enumerate_adapters(backends));
    if let Some(want) = rlx_ir::env::get(rlx_ir::env::WGPU_ADAPTER) {
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        return adapters
            .into_iter()
            .find(|a| {
                a.get_info()
                    .name
                    .to_lowercase()
                    .contains(&want.to_lowercase())
            })
            .ok_or_else(|| {
                format!("no adapter named like RLX_WGPU_ADAPTER=\"{want}\"; found {names:?}")
            });
    }
    let options = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    };
    pollster::block_on(instance.request_adapter(&options)).map_err(|e| {
        format!("no {device:?} adapter ({e}); on Linux without a GPU, install Mesa's software Vulkan: apt-get install mesa-vulkan-drivers")
    })
}

/// Whether `device` has an adapter (probed once per device).
pub fn available(device: Device) -> bool {
    static PROBED: OnceLock<std::sync::Mutex<Vec<(Device, bool)>>> = OnceLock::new();
    let probed = PROBED.get_or_init(Default::default);
    let mut p = probed.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, a)) = p.iter().find(|(d, _)| *d == device) {
        return a;
    }
    let a = adapter(device).is_ok();
    p.push((device, a));
    a
}
