//! Training: losses, optimizers with learning-rate schedules and gradient clipping, compiled
//! into one graph per step, and checkpoints.
//!
//! [`Trainer`] differentiates a forward graph whose first output is the loss, appends the
//! optimizer update for every trained param, and compiles the whole step once. Each
//! [`Trainer::step`] runs forward, backward and update together; the new params and optimizer
//! state overwrite the old ones inside the runtime (no host copy of the weights per step).

mod checkpoint;
mod losses;
mod optim;
mod trainer;

pub use losses::{mse, softmax_cross_entropy};
pub use optim::{Optimizer, Schedule, TrainConfig};
pub use trainer::{step_graph, Trainer};
