//! The compiled training step.

use super::optim::{clip, lr_node, update, TrainConfig};
use rlx_ir::{DType, Error, Graph, Op, Result, Shape};
use rlx_opt::autodiff::{bake_input, grad_with_loss, D_OUTPUT};
use rlx_runtime::{CompiledGraph, Session};

/// Name of the scalar f32 input carrying the 1-based step number into the step graph.
pub const STEP_INPUT: &str = "train_step";

/// A model plus its optimizer, compiled as one step: forward, backward, update.
pub struct Trainer {
    compiled: CompiledGraph,
    step: u64,
    config: TrainConfig,
    trained: Vec<String>,
}

/// Name of optimizer slot `slot` of param `param`.
pub fn slot_name(param: &str, slot: &str) -> String {
    format!("{param}::{slot}")
}

impl Trainer {
    /// Build and compile the training step of `forward` (first output: the scalar loss) for the
    /// params named in `trained`. Optimizer state starts at zero. With a compile cache on
    /// `session` that holds this step (same model graph, params, configuration and RLX
    /// version), the step is read from it without differentiating the model again.
    pub fn new(
        forward: &Graph,
        trained: &[&str],
        config: TrainConfig,
        session: &Session,
    ) -> Result<Trainer> {
        for name in trained {
            match forward.find_leaf(name) {
                Some(id) if matches!(forward.node(id).op, Op::Param { .. }) => {}
                _ => {
                    return Err(Error::Invalid(format!(
                        "\"{name}\" is not a param of graph \"{}\"",
                        forward.name()
                    )))
                }
            }
        }
        let loss = *forward.outputs().first().ok_or_else(|| {
            Error::Invalid("the forward graph needs the loss as its first output".into())
        })?;
        if forward.shape(loss).numel() != Some(1) {
            return Err(Error::Invalid(format!(
                "the loss must be a scalar, got {}",
                forward.shape(loss)
            )));
        }
        // Bound at compile time, the updates are computed straight into the params' storage:
        // the trained params are outputs 1.., then each param's optimizer slots in order.
        let slots: Vec<String> = trained
            .iter()
            .flat_map(|name| config.optimizer.slots().iter().map(|s| slot_name(name, s)))
            .collect();
        let mut updates: Vec<(&str, usize)> = trained
            .iter()
            .enumerate()
            .map(|(i, name)| (*name, 1 + i))
            .collect();
        updates.extend(
            slots
                .iter()
                .enumerate()
                .map(|(j, name)| (name.as_str(), 1 + trained.len() + j)),
        );
        // The step graph is a function of the model graph, the trained params and the
        // configuration (and of this code): with a compile cache that has it, it is not built.
        let key = format!(
            "rlx {} training step\ntrained {trained:?}\nconfig {config:?}\n{forward}",
            env!("CARGO_PKG_VERSION")
        );
        let build = || step_graph(forward, trained, &config);
        let compiled = session.try_compile_built(&key, build, &updates)?;
        Ok(Trainer {
            compiled,
            step: 0,
            config,
            trained: trained.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The learning rate the next step will use.
    pub fn next_lr(&self) -> f32 {
        self.config.schedule.at(self.step + 1)
    }

    /// Names of the trained params.
    pub fn trained(&self) -> &[String] {
        &self.trained
    }

    /// The compiled step (params, optimizer slots, pass records).
    pub fn compiled(&self) -> &CompiledGraph {
        &self.compiled
    }

    /// Set a param (or optimizer slot) from f32 values.
    pub fn set_param(&mut self, name: &str, values: &[f32]) -> Result<()> {
        self.compiled.try_set_param(name, values)
    }

    /// Read a param (or optimizer slot) as f32.
    pub fn get_param(&self, name: &str) -> Result<Vec<f32>> {
        self.compiled.try_get_param(name)
    }

    /// One training step on a batch given as f32 inputs; returns the loss before the update.
    pub fn step(&mut self, inputs: &[(&str, &[f32])]) -> Result<f32> {
        let s = [(self.step + 1) as f32];
        let mut feeds: Vec<(&str, &[f32])> = inputs.to_vec();
        feeds.push((STEP_INPUT, &s));
        let out = self.compiled.try_run(&feeds)?;
        self.step += 1;
        Ok(out[0][0])
    }

    /// One training step on raw typed inputs (e.g. integer token ids); returns the loss.
    pub fn step_typed(&mut self, inputs: &[(&str, &[u8], DType)]) -> Result<f32> {
        let s = ((self.step + 1) as f32).to_le_bytes();
        let mut feeds: Vec<(&str, &[u8], DType)> = inputs.to_vec();
        feeds.push((STEP_INPUT, &s, DType::F32));
        let out = self.compiled.try_run_typed(&feeds)?;
        self.step += 1;
        let mut v = [0f32];
        rlx_ir::convert::dtype_to_f32(&out[0].0, out[0].1, &mut v);
        Ok(v[0])
    }

    /// Save every param and optimizer slot, and the step count, as safetensors.
    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        super::checkpoint::save(&self.compiled, self.step, path)
    }

    /// Load a checkpoint written by [`Trainer::save`]; the next step continues from it. A file
    /// that does not match the model (names, shapes, dtypes) is an error and changes nothing.
    pub fn load(&mut self, path: &std::path::Path) -> Result<()> {
        self.step = super::checkpoint::load(&mut self.compiled, path)?;
        Ok(())
    }

    /// [`Trainer::load`] from bytes already in memory.
    pub fn load_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.step = super::checkpoint::load_bytes(
            &mut self.compiled,
            bytes,
            std::path::Path::new("<memory>"),
        )?;
        Ok(())
    }
}

/// The training step graph [`Trainer::new`] compiles for `forward` (first output: the scalar
/// loss) and the params named in `trained`: inputs of the forward graph plus the step number;
/// outputs the loss, the updated params, then each param's updated optimizer slots. Lets a
/// backend's kernels for a training step be inspected or compile-checked without compiling it.
pub fn step_graph(forward: &Graph, trained: &[&str], config: &TrainConfig) -> Result<Graph> {
    let mut wrt = Vec::new();
    for name in trained {
        match forward.find_leaf(name) {
            Some(id) if matches!(forward.node(id).op, Op::Param { .. }) => wrt.push(id),
            _ => {
                return Err(Error::Invalid(format!(
                    "\"{name}\" is not a param of graph \"{}\"",
                    forward.name()
                )))
            }
        }
    }
    let mut g = bake_input(&grad_with_loss(forward, &wrt)?, D_OUTPUT, 1.0)?;
    let outs = g.outputs().to_vec();
    let step = g.try_input(STEP_INPUT, Shape::scalar(DType::F32))?;
    let lr = lr_node(&mut g, &config.schedule, step)?;
    let mut grads = outs[1..].to_vec();
    if let Some(c) = config.clip_norm {
        grads = clip(&mut g, &grads, c)?;
    }
    let mut new_params = Vec::new();
    let mut new_slots = Vec::new();
    for (name, &gr) in trained.iter().zip(&grads) {
        let p = g
            .find_leaf(name)
            .expect("trained params survive differentiation");
        let shape = g.shape(p).clone();
        let mut state = Vec::new();
        for s in config.optimizer.slots() {
            state.push(g.try_param(&slot_name(name, s), shape.clone())?);
        }
        let (np, ns) = update(&mut g, &config.optimizer, lr, step, p, gr, &state)?;
        new_params.push(np);
        new_slots.extend(ns);
    }
    let mut outputs = vec![outs[0]];
    outputs.extend(&new_params);
    outputs.extend(&new_slots);
    g.try_set_outputs(outputs)?;
    Ok(g)
}
