"""Goldens for complex numbers and the Fourier transforms under autodiff.

Each case is a function of f32 and c64 inputs to a real loss, written the same way in
``crates/rlx/tests/complex.rs`` (by name). JAX (x64, so complex128 on the c64 inputs) gives
the loss, ``jax.grad`` with respect to every input (JAX's convention for complex inputs:
``dL/dx - i dL/dy``) and ``jax.jvp`` along fixed tangents.

Run with the pinned environment (``scripts/regen-goldens.sh``); the output is deterministic.
"""

import json
from pathlib import Path

import numpy as np
import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")
import jax.numpy as jnp  # noqa: E402

rng = np.random.default_rng(20261127)


def real(shape):
    return rng.standard_normal(shape).astype(np.float32)


def cplx(shape):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


def fft_power(z, w):
    return jnp.sum(jnp.abs(jnp.fft.fft(z, axis=1)) ** 2 * w)


def rfft_filter(x, h, v):
    return jnp.sum(jnp.fft.irfft(jnp.fft.rfft(x, axis=1) * h, n=9, axis=1) * v)


def ifft_axis0(z, a, b):
    y = jnp.fft.ifft(z, axis=0)
    return jnp.sum(jnp.real(y) * a + jnp.imag(y) * b)


def arith(z, w):
    q = jnp.exp(z * 0.5) * w / (z + (2.0 + 1.0j))
    return jnp.sum(jnp.abs(q)) + jnp.sum(jnp.real(jnp.log(w))) + jnp.sum(jnp.angle(z))


def matmul(a, b, c, d):
    p = a @ b
    return jnp.sum(jnp.real(p) * c + jnp.imag(jnp.conj(p)) * d)


def rfft2(x, w):
    return jnp.sum(jnp.abs(jnp.fft.rfft2(x)) * w)


def irfft2(z, w):
    return jnp.sum(jnp.fft.irfft2(z, s=(6, 8)) * w)


def prime(z):
    return jnp.sum(jnp.abs(jnp.fft.fft(z) * jnp.conj(z)))


def padded(x, w):
    # numpy's n: zero-padded to 12, then cropped back to 5 by irfft.
    return jnp.sum(jnp.fft.irfft(jnp.fft.rfft(x, n=12), n=5) * w)


def movement(z, w):
    t = jnp.transpose(z, (2, 0, 1))
    m = jnp.mean(t, axis=1)
    s = jnp.concatenate([m, jnp.sum(z, axis=(0, 1))[:, None]], axis=1)
    return jnp.sum(jnp.abs(s) * w)


def frames_index(n_frames, n_fft, hop):
    return np.arange(n_frames)[:, None] * hop + np.arange(n_fft)[None, :]


def stft_ref(x, n_fft, hop, w):
    """Frames of n_fft every hop (no padding), windowed, rfft: [..., frames, n_fft/2+1]."""
    n_frames = 1 + (x.shape[-1] - n_fft) // hop
    return jnp.fft.rfft(x[..., frames_index(n_frames, n_fft, hop)] * w, axis=-1)


def istft_ref(z, n_fft, hop, w):
    """Weighted overlap-add of the windowed irfft frames over the summed squared window."""
    n_frames = z.shape[-2]
    length = (n_frames - 1) * hop + n_fft
    idx = frames_index(n_frames, n_fft, hop).reshape(-1)
    y = jnp.fft.irfft(z, n=n_fft, axis=-1) * w
    acc = jnp.zeros(z.shape[:-2] + (length,), y.dtype).at[..., idx].add(y.reshape(z.shape[:-2] + (-1,)))
    wsum = jnp.zeros(length, y.dtype).at[idx].add(jnp.broadcast_to(w * w, (n_frames, n_fft)).reshape(-1))
    covered = wsum > 1e-11
    return jnp.where(covered, acc / jnp.where(covered, wsum, 1.0), 0.0)


def stft(x, w, v):
    return jnp.sum(jnp.abs(stft_ref(x, 16, 6, w)) * v)


def istft(z, w, v):
    return jnp.sum(istft_ref(z, 16, 6, w) * v)


CASES = [
    ("fft_power", fft_power, [cplx([5, 7]), real([5, 7])]),
    ("rfft_filter", rfft_filter, [real([4, 9]), cplx([4, 5]), real([4, 9])]),
    ("ifft_axis0", ifft_axis0, [cplx([6, 3]), real([6, 3]), real([6, 3])]),
    ("arith", arith, [cplx([3, 4]), cplx([3, 4])]),
    ("matmul", matmul, [cplx([3, 4]), cplx([4, 2]), real([3, 2]), real([3, 2])]),
    ("rfft2", rfft2, [real([6, 8]), real([6, 5])]),
    ("irfft2", irfft2, [cplx([6, 5]), real([6, 8])]),
    ("prime", prime, [cplx([13])]),
    ("padded", padded, [real([7]), real([5])]),
    ("movement", movement, [cplx([2, 3, 4]), real([4, 4])]),
    ("stft", stft, [real([2, 40]), (0.5 + 0.5 * rng.random(16)).astype(np.float32), real([2, 5, 9])]),
    ("istft", istft, [cplx([5, 9]), (0.5 + 0.5 * rng.random(16)).astype(np.float32), real([40])]),
]


def tensor(v):
    v = np.asarray(v)
    if np.iscomplexobj(v):
        flat = np.stack([v.real, v.imag], axis=-1).reshape(-1)
        dtype = "c64"
    else:
        flat = v.reshape(-1)
        dtype = "f32"
    return {"shape": list(v.shape), "dtype": dtype, "data": [float(x) for x in flat]}


def wide(v):
    return v.astype(np.complex128) if np.iscomplexobj(v) else v.astype(np.float64)


def main():
    out = []
    for name, fn, args in CASES:
        wargs = [wide(a) for a in args]
        loss = float(fn(*wargs))
        grads = jax.grad(fn, argnums=tuple(range(len(args))))(*wargs)
        tangents = [cplx(a.shape) if np.iscomplexobj(a) else real(a.shape) for a in args]
        _, tan = jax.jvp(fn, tuple(wargs), tuple(wide(t) for t in tangents))
        out.append({
            "name": name,
            "inputs": [tensor(a) for a in args],
            "loss": loss,
            "grads": [tensor(np.asarray(g)) for g in grads],
            "tangents": [tensor(t) for t in tangents],
            "jvp": float(tan),
        })
    path = Path(__file__).with_name("complex.json")
    meta = {"generator": "gen_complex.py", "numpy": np.__version__, "jax": jax.__version__}
    path.write_text(json.dumps({"meta": meta, "cases": out}, indent=1) + "\n")
    print(f"wrote {len(out)} cases to {path}")


if __name__ == "__main__":
    main()
