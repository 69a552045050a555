//! A lost device is a named error from every exchange and run, never a panic; the next compile
//! opens the adapter again. One test in its own binary: destroying the device would fail any
//! other test of the process sharing it.

use rlx_driver::{Backend, CompileOptions, Device};
use rlx_ir::{DType, Error, Graph, Shape};
use rlx_wgpu::{GpuProgram, WgpuBackend};

fn graph() -> Graph {
    let mut g = Graph::new("add");
    let x = g.input("x", Shape::new(&[4], DType::F32));
    let w = g.param("w", Shape::new(&[4], DType::F32));
    let y = g.add(x, w);
    g.set_outputs(vec![y]);
    g
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn gpu_a_lost_device_is_a_named_error_and_is_opened_again() {
    assert!(
        Device::Gpu.is_available(),
        "no GPU adapter: {}",
        Device::Gpu.availability_hint()
    );
    let backend = WgpuBackend {
        device: Device::Gpu,
    };
    let mut exe = backend
        .compile(&graph(), &CompileOptions::default())
        .unwrap();
    exe.write_param(0, &bytes(&[1.0; 4])).unwrap();
    exe.write_input(0, &bytes(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    exe.execute().unwrap();
    let mut out = vec![0u8; 16];
    exe.read_output(0, &mut out).unwrap();
    assert_eq!(out, bytes(&[2.0, 3.0, 4.0, 5.0]));

    // A buffer of the wrong length is an error naming the slot, not a panic.
    let e = exe.write_input(0, &[0u8; 3]).unwrap_err();
    assert!(e.to_string().contains("input \"x\""), "{e}");

    let program = exe
        .as_any()
        .and_then(|a| a.downcast_ref::<GpuProgram>())
        .unwrap();
    let gpu = program.gpu().clone();
    gpu.device.destroy();
    // The loss is reported when the device notices it: at the latest by the next wait.
    let _ = gpu.device.poll(wgpu::PollType::Wait {
        submission_index: None,
        timeout: None,
    });
    assert!(gpu.is_lost(), "destroying the device loses it");
    let lost = |r: Result<(), Error>, what: &str| match r {
        Err(e @ Error::Device { .. }) => {
            let text = e.to_string();
            assert!(text.contains("lost"), "{what}: {text}");
        }
        other => panic!("{what}: expected a device error, got {other:?}"),
    };
    lost(exe.execute(), "execute");
    lost(exe.read_output(0, &mut out), "read_output");
    lost(exe.write_input(0, &bytes(&[0.0; 4])), "write_input");
    let mut p = vec![0u8; 16];
    lost(exe.read_param(0, &mut p), "read_param");

    // A new compile opens the adapter again and runs.
    let mut again = backend
        .compile(&graph(), &CompileOptions::default())
        .unwrap();
    again.write_param(0, &bytes(&[0.5; 4])).unwrap();
    again.write_input(0, &bytes(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    again.execute().unwrap();
    again.read_output(0, &mut out).unwrap();
    assert_eq!(out, bytes(&[1.5, 2.5, 3.5, 4.5]));
}
