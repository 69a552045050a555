//! Fuzz the encoder weights loader (`rlx::embed::read_weights`, what `Embedder::load` does with
//! `model.safetensors`): any bytes must give the params or an error naming the file, never a
//! panic. The first byte picks one of a few small BERT configs (1 or 2 layers, F32 tables of
//! width 8); the seed is a complete file for the first of them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlx::embed::{read_weights, EncoderConfig, HiddenAct, Pooling};

fn config(pick: u8) -> EncoderConfig {
    EncoderConfig {
        vocab: 11,
        hidden: 8,
        layers: 1 + (pick as usize & 1),
        heads: 2,
        intermediate: 16,
        max_positions: 16,
        type_vocab: 1 + (pick as usize >> 1 & 1),
        eps: 1e-12,
        act: HiddenAct::Gelu,
        pad_id: 0,
        max_length: 16,
        pooling: Pooling::Mean,
        normalize: true,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    // Seeds are complete files for config(0): a leading byte of 0 keeps them intact.
    let cfg = config(pick);
    if let Err(e) = read_weights("model.safetensors", bytes, &cfg) {
        assert!(e.to_string().contains("model.safetensors"), "{e}");
    }
});
