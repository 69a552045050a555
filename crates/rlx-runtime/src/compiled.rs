//! A compiled graph: named I/O over a backend executable, with dtype conversion for the f32
//! convenience API and exact byte I/O for every dtype.

use rlx_driver::{Backend, Device, Executable, IoSlot};
use rlx_ir::{convert, DType, Error, Graph, Result};
use rlx_opt::{FusionReport, KernelDispatchReport, LoweringPlan, PassRecord};
use std::sync::Arc;

/// A graph compiled for one device, ready to run. Create it with [`crate::Session::compile`].
pub struct CompiledGraph {
    exe: Box<dyn Executable>,
    /// The graph lowered, the pass records and the lowering plan (shared with the compile
    /// cache's entry when there is one).
    compiled: Arc<crate::cache::Entry>,
    /// The backend that compiled it (for the dispatch report, made when first asked for).
    backend: Arc<dyn Backend>,
    dispatch: std::sync::OnceLock<KernelDispatchReport>,
    device: Device,
    /// Per-input staging bytes for dtype conversion (allocated once, so `run` does not allocate).
    staging_in: Vec<Vec<u8>>,
    /// Per-output staging bytes for non-f32 outputs.
    staging_out: Vec<Vec<u8>>,
    /// `(param, output)`: after each run the output overwrites the param (training updates).
    updates: Vec<(usize, usize)>,
    /// Outputs returned by `run` (those that are not updates), in order.
    visible: Vec<usize>,
}

/// What runs where when `backend` runs `graph` (compiled after the passes of `records`, fused as
/// `plan` says).
pub(crate) fn dispatch_report(
    backend: &dyn Backend,
    graph: &Graph,
    records: &[PassRecord],
    plan: &LoweringPlan,
) -> KernelDispatchReport {
    KernelDispatchReport::new(
        backend.name(),
        graph,
        &|g, id| backend.supports(g, id),
        records,
        &plan.fusion,
    )
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 slice is a valid byte slice of 4x the length (u8 has alignment 1).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn f32_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: as above; every byte pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

fn find(slots: &[IoSlot], kind: &'static str, name: &str) -> Result<usize> {
    slots
        .iter()
        .position(|s| s.name == name)
        .ok_or_else(|| Error::UnknownName {
            kind,
            name: name.to_string(),
            known: slots.iter().map(|s| s.name.clone()).collect(),
        })
}

fn numel(s: &IoSlot) -> usize {
    s.shape.numel().unwrap_or(0)
}

impl CompiledGraph {
    pub(crate) fn new(
        exe: Box<dyn Executable>,
        compiled: Arc<crate::cache::Entry>,
        backend: Arc<dyn Backend>,
        device: Device,
    ) -> Self {
        let size = |s: &IoSlot| s.shape.size_bytes().unwrap_or(0);
        let staging_in = exe
            .inputs()
            .iter()
            .map(|s| {
                if s.shape.dtype() == DType::F32 {
                    Vec::new()
                } else {
                    vec![0; size(s)]
                }
            })
            .collect();
        let staging_out = exe
            .outputs()
            .iter()
            .map(|s| {
                if s.shape.dtype() == DType::F32 {
                    Vec::new()
                } else {
                    vec![0; size(s)]
                }
            })
            .collect();
        let visible = (0..exe.outputs().len()).collect();
        CompiledGraph {
            exe,
            compiled,
            backend,
            dispatch: std::sync::OnceLock::new(),
            device,
            staging_in,
            staging_out,
            updates: Vec::new(),
            visible,
        }
    }

    /// The backend's executable (a backend's own tests downcast it through `as_any`).
    pub fn executable(&self) -> &dyn Executable {
        self.exe.as_ref()
    }

    /// Make output `output` overwrite param `param` after every run (on the device, without a
    /// host copy), and stop returning it from `run`. Used by training steps.
    pub fn try_bind_update(&mut self, param: &str, output: usize) -> Result<()> {
        let p = find(self.exe.params(), "param", param)?;
        let o = self.exe.outputs().get(output).ok_or_else(|| {
            Error::Invalid(format!("no output {output} to bind to param \"{param}\""))
        })?;
        let ps = &self.exe.params()[p].shape;
        if o.shape != *ps {
            return Err(Error::Invalid(format!(
                "output {output} has shape {} but param \"{param}\" is {ps}",
                o.shape
            )));
        }
        if self.updates.iter().any(|&(q, _)| q == p) {
            return Err(Error::Invalid(format!(
                "param \"{param}\" already has an update bound"
            )));
        }
        self.updates.push((p, output));
        self.visible.retain(|&i| i != output);
        Ok(())
    }

    /// Run the graph and apply the bound param updates.
    fn execute(&mut self) -> Result<()> {
        self.exe.execute()?;
        for &(p, o) in &self.updates {
            self.exe.assign_param(p, o)?;
        }
        Ok(())
    }

    /// The device it runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The optimized graph that was compiled.
    pub fn graph(&self) -> &Graph {
        &self.compiled.graph
    }

    /// What each compile pass did.
    pub fn pass_records(&self) -> &[PassRecord] {
        &self.compiled.records
    }

    /// The compiler's lowering decisions the backend followed: causal skips, permuted stores,
    /// donated updates and the fusion report.
    pub fn lowering_plan(&self) -> &LoweringPlan {
        &self.compiled.plan
    }

    /// What fusion did: ops per kind before and after, the regions, and why each candidate
    /// that joined none did not.
    pub fn fusion_report(&self) -> &FusionReport {
        &self.compiled.plan.fusion
    }

    /// What runs where: each node of the compiled graph native, fused (into which region) or
    /// unsupported, and which ops were decomposed first by which rule.
    pub fn dispatch_report(&self) -> &KernelDispatchReport {
        self.dispatch.get_or_init(|| {
            dispatch_report(
                self.backend.as_ref(),
                &self.compiled.graph,
                &self.compiled.records,
                &self.compiled.plan,
            )
        })
    }

    /// Input slots (name, shape), in definition order.
    pub fn inputs(&self) -> &[IoSlot] {
        self.exe.inputs()
    }

    /// Param slots (name, shape), in definition order.
    pub fn params(&self) -> &[IoSlot] {
        self.exe.params()
    }

    /// Output slots, in order.
    pub fn outputs(&self) -> &[IoSlot] {
        self.exe.outputs()
    }

    /// Set a param from f32 values (converted to its dtype; integer and bool params must get
    /// values they hold exactly).
    pub fn try_set_param(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let i = find(self.exe.params(), "param", name)?;
        let slot = &self.exe.params()[i];
        if values.len() != numel(slot) {
            return Err(Error::Length {
                kind: "param",
                name: name.into(),
                shape: slot.shape.to_string(),
                expected: numel(slot),
                actual: values.len(),
            });
        }
        let dt = slot.shape.dtype();
        if dt == DType::F32 {
            return self.exe.write_param(i, f32_bytes(values));
        }
        let mut bytes = vec![0u8; values.len() * dt.size_bytes()];
        convert::f32_to_dtype(values, dt, &mut bytes).map_err(|at| Error::DType {
            kind: "param",
            name: name.into(),
            expected: dt,
            actual: DType::F32,
            msg: format!(
                "value {} at index {at} does not fit; use set_param_typed",
                values[at]
            ),
        })?;
        self.exe.write_param(i, &bytes)
    }

    /// Short form of [`CompiledGraph::try_set_param`]; panics with its error.
    #[track_caller]
    pub fn set_param(&mut self, name: &str, values: &[f32]) {
        self.try_set_param(name, values)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Set a param from raw little-endian bytes of its declared dtype (bool bytes must be 0 or 1).
    /// f32 bytes for an f16 / bf16 param (one a precision policy stores in low precision) are
    /// rounded to it.
    pub fn try_set_param_typed(&mut self, name: &str, bytes: &[u8], dtype: DType) -> Result<()> {
        let i = find(self.exe.params(), "param", name)?;
        let slot = &self.exe.params()[i];
        if dtype == DType::F32
            && matches!(slot.shape.dtype(), DType::F16 | DType::BF16)
            && bytes.len().is_multiple_of(4)
        {
            let v: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            return self.try_set_param(name, &v);
        }
        check_typed("param", slot, name, bytes, dtype)?;
        self.exe.write_param(i, bytes)
    }

    /// Write raw bytes into part of a param: `bytes` go to byte `offset` of its little-endian
    /// storage. Large weights can be streamed in pieces this way (e.g. from a memory-mapped file,
    /// so only one piece of the file needs to be resident at a time).
    pub fn try_set_param_bytes_at(
        &mut self,
        name: &str,
        offset: usize,
        bytes: &[u8],
    ) -> Result<()> {
        let i = find(self.exe.params(), "param", name)?;
        let slot = &self.exe.params()[i];
        let size = slot.shape.size_bytes().unwrap_or(0);
        if offset.checked_add(bytes.len()).is_none_or(|end| end > size) {
            return Err(Error::Invalid(format!(
                "param \"{name}\" has {size} bytes ({}); cannot write {} bytes at offset {offset}",
                slot.shape,
                bytes.len()
            )));
        }
        if slot.shape.dtype() == DType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err(Error::Invalid(format!(
                "param \"{name}\" is bool: bytes must be 0 or 1"
            )));
        }
        self.exe.write_param_range(i, offset, bytes)
    }

    /// Short form of [`CompiledGraph::try_set_param_typed`]; panics with its error.
    #[track_caller]
    pub fn set_param_typed(&mut self, name: &str, bytes: &[u8], dtype: DType) {
        self.try_set_param_typed(name, bytes, dtype)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Read a param back as f32.
    pub fn try_get_param(&self, name: &str) -> Result<Vec<f32>> {
        let i = find(self.exe.params(), "param", name)?;
        let slot = &self.exe.params()[i];
        let mut bytes = vec![0u8; slot.shape.size_bytes().unwrap_or(0)];
        self.exe.read_param(i, &mut bytes)?;
        let mut out = vec![0f32; numel(slot)];
        convert::dtype_to_f32(&bytes, slot.shape.dtype(), &mut out);
        Ok(out)
    }

    /// Read a param back as raw little-endian bytes with its dtype.
    pub fn try_get_param_typed(&self, name: &str) -> Result<(Vec<u8>, DType)> {
        let i = find(self.exe.params(), "param", name)?;
        let slot = &self.exe.params()[i];
        let mut bytes = vec![0u8; slot.shape.size_bytes().unwrap_or(0)];
        self.exe.read_param(i, &mut bytes)?;
        Ok((bytes, slot.shape.dtype()))
    }

    /// Check the named inputs against the graph: every input given once, no unknown names.
    fn match_inputs<'n>(&self, names: impl Iterator<Item = &'n str> + Clone) -> Result<()> {
        for n in names.clone() {
            find(self.exe.inputs(), "input", n)?;
            if names.clone().filter(|m| *m == n).count() > 1 {
                return Err(Error::Invalid(format!(
                    "input \"{n}\" is given more than once"
                )));
            }
        }
        for s in self.exe.inputs() {
            if !names.clone().any(|n| n == s.name) {
                return Err(Error::MissingInput {
                    name: s.name.clone(),
                });
            }
        }
        Ok(())
    }

    /// Run with f32 inputs (converted to each input's dtype), returning every output as f32.
    pub fn try_run(&mut self, inputs: &[(&str, &[f32])]) -> Result<Vec<Vec<f32>>> {
        self.match_inputs(inputs.iter().map(|(n, _)| *n))?;
        for (name, values) in inputs {
            let i = find(self.exe.inputs(), "input", name)?;
            let slot = &self.exe.inputs()[i];
            if values.len() != numel(slot) {
                return Err(Error::Length {
                    kind: "input",
                    name: name.to_string(),
                    shape: slot.shape.to_string(),
                    expected: numel(slot),
                    actual: values.len(),
                });
            }
            let dt = slot.shape.dtype();
            if dt == DType::F32 {
                self.exe.write_input(i, f32_bytes(values))?;
            } else {
                let mut staged = std::mem::take(&mut self.staging_in[i]);
                let r = convert::f32_to_dtype(values, dt, &mut staged);
                if let Err(at) = r {
                    self.staging_in[i] = staged;
                    return Err(Error::DType {
                        kind: "input",
                        name: name.to_string(),
                        expected: dt,
                        actual: DType::F32,
                        msg: format!(
                            "value {} at index {at} does not fit; use run_typed",
                            values[at]
                        ),
                    });
                }
                let written = self.exe.write_input(i, &staged);
                self.staging_in[i] = staged;
                written?;
            }
        }
        self.execute()?;
        self.read_outputs_f32()
    }

    /// Every visible output as f32 (converted from its dtype), after a run.
    fn read_outputs_f32(&mut self) -> Result<Vec<Vec<f32>>> {
        let mut outs = Vec::with_capacity(self.visible.len());
        for vi in 0..self.visible.len() {
            let mut v = Vec::new();
            self.read_output_f32_into(vi, &mut v)?;
            outs.push(v);
        }
        Ok(outs)
    }

    /// Visible output `vi` as f32 into `v` (resized to it; its memory reused when large enough).
    fn read_output_f32_into(&mut self, vi: usize, v: &mut Vec<f32>) -> Result<()> {
        let i = self.visible[vi];
        let slot = &self.exe.outputs()[i];
        v.resize(numel(slot), 0.0);
        if slot.shape.dtype() == DType::F32 {
            self.exe.read_output(i, f32_bytes_mut(v))
        } else {
            let dt = slot.shape.dtype();
            let mut staged = std::mem::take(&mut self.staging_out[i]);
            let read = self.exe.read_output(i, &mut staged);
            if read.is_ok() {
                convert::dtype_to_f32(&staged, dt, v);
            }
            self.staging_out[i] = staged;
            read
        }
    }

    /// Short form of [`CompiledGraph::try_run`]; panics with its error.
    #[track_caller]
    pub fn run(&mut self, inputs: &[(&str, &[f32])]) -> Vec<Vec<f32>> {
        self.try_run(inputs).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Run with raw little-endian inputs of each input's declared dtype; outputs come back as
    /// raw bytes with their dtype. Bool bytes must be 0 or 1.
    pub fn try_run_typed(
        &mut self,
        inputs: &[(&str, &[u8], DType)],
    ) -> Result<Vec<(Vec<u8>, DType)>> {
        self.write_typed_inputs(inputs)?;
        self.execute()?;
        let mut outs = Vec::with_capacity(self.visible.len());
        for &i in &self.visible {
            let s = &self.exe.outputs()[i];
            let mut b = vec![0u8; s.shape.size_bytes().unwrap_or(0)];
            self.exe.read_output(i, &mut b)?;
            outs.push((b, s.shape.dtype()));
        }
        Ok(outs)
    }

    /// [`CompiledGraph::try_run_typed`]'s inputs, [`CompiledGraph::try_run`]'s outputs: raw
    /// inputs of each input's dtype (token ids, positions), every output as f32, read straight
    /// into its vector (one copy, no byte staging: what a server reading large logits wants).
    pub fn try_run_typed_f32(&mut self, inputs: &[(&str, &[u8], DType)]) -> Result<Vec<Vec<f32>>> {
        self.write_typed_inputs(inputs)?;
        self.execute()?;
        self.read_outputs_f32()
    }

    /// [`CompiledGraph::try_run_typed_f32`] for a graph with one output, read into `out`,
    /// whose memory is reused from run to run: a server stepping a model every few
    /// milliseconds otherwise maps, zeroes and frees a fresh logits buffer each time (16 MB a
    /// step for 16 rows of Gemma 3's 262k-token vocabulary).
    pub fn try_run_typed_f32_into(
        &mut self,
        inputs: &[(&str, &[u8], DType)],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if self.visible.len() != 1 {
            return Err(Error::Invalid(format!(
                "try_run_typed_f32_into reads one output; the graph has {}",
                self.visible.len()
            )));
        }
        self.write_typed_inputs(inputs)?;
        self.execute()?;
        self.read_output_f32_into(0, out)
    }

    /// Check and write raw inputs of each input's declared dtype.
    fn write_typed_inputs(&mut self, inputs: &[(&str, &[u8], DType)]) -> Result<()> {
        self.match_inputs(inputs.iter().map(|(n, _, _)| *n))?;
        for (name, bytes, dt) in inputs {
            let i = find(self.exe.inputs(), "input", name)?;
            check_typed("input", &self.exe.inputs()[i], name, bytes, *dt)?;
            self.exe.write_input(i, bytes)?;
        }
        Ok(())
    }

    /// Short form of [`CompiledGraph::try_run_typed`]; panics with its error.
    #[track_caller]
    pub fn run_typed(&mut self, inputs: &[(&str, &[u8], DType)]) -> Vec<(Vec<u8>, DType)> {
        self.try_run_typed(inputs).unwrap_or_else(|e| panic!("{e}"))
    }
}

fn check_typed(
    kind: &'static str,
    slot: &IoSlot,
    name: &str,
    bytes: &[u8],
    dtype: DType,
) -> Result<()> {
    let want = slot.shape.dtype();
    if dtype != want {
        return Err(Error::DType {
            kind,
            name: name.into(),
            expected: want,
            actual: dtype,
            msg: String::new(),
        });
    }
    let w = want.size_bytes();
    if !bytes.len().is_multiple_of(w) {
        return Err(Error::Invalid(format!(
            "{kind} \"{name}\" has shape {} ({} elements of {w} bytes) but {} bytes were given, not a whole number of {want} elements",
            slot.shape,
            numel(slot),
            bytes.len()
        )));
    }
    if bytes.len() != numel(slot) * w {
        return Err(Error::Length {
            kind,
            name: name.into(),
            shape: slot.shape.to_string(),
            expected: numel(slot),
            actual: bytes.len() / w,
        });
    }
    // Kernels rely on bools being exactly 0 or 1.
    if want == DType::Bool {
        if let Some((at, b)) = bytes.iter().enumerate().find(|(_, &b)| b > 1) {
            return Err(Error::DType {
                kind,
                name: name.into(),
                expected: want,
                actual: dtype,
                msg: format!("byte {b} at index {at} is not a bool; use 0 or 1"),
            });
        }
    }
    Ok(())
}
