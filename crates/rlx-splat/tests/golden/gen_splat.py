"""Goldens for rlx-splat: Gaussian splatting written in JAX (x64), independently of the Rust
code: the projection with the 2-D covariance inverted by jnp.linalg.inv, the depth order by a
stable argsort, compositing with the transmittance as an exclusive cumprod; and the gradients of
sum(image * W) with respect to means, covariances, colours, opacities, background and the view
matrix.

Run by scripts/regen-goldens.sh (pinned environment); the output is deterministic.
"""
import json
import os

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

NEAR, BLUR, ALPHA_MAX, ALPHA_MIN = 0.2, 0.3, 0.99, 1.0 / 255.0

rng = np.random.RandomState(20261128)


def project(means, covs, view, k):
    fx, fy, cx, cy = k
    r, t = view[:3, :3], view[:3, 3]
    p = means @ r.T + t
    x, y, depth = p[:, 0], p[:, 1], p[:, 2]
    z = jnp.maximum(depth, NEAR)
    n = means.shape[0]
    j = jnp.zeros((n, 2, 3))
    j = j.at[:, 0, 0].set(fx / z).at[:, 0, 2].set(-fx * x / z**2)
    j = j.at[:, 1, 1].set(fy / z).at[:, 1, 2].set(-fy * y / z**2)
    m = j @ r
    s = m @ covs @ jnp.swapaxes(m, 1, 2)
    s = 0.5 * (s + jnp.swapaxes(s, 1, 2)) + BLUR * jnp.eye(2)
    conic = jnp.linalg.inv(s)
    return jnp.stack(
        [fx * x / z + cx, fy * y / z + cy, conic[:, 0, 0], conic[:, 0, 1], conic[:, 1, 1], depth],
        axis=1,
    )


def rasterize(proj, colours, opac, bg, h, w):
    ys, xs = np.mgrid[0:h, 0:w]
    px, py = xs.ravel() + 0.5, ys.ravel() + 0.5
    u, v, a, b, c, depth = (proj[:, i] for i in range(6))
    dx, dy = px[:, None] - u[None], py[:, None] - v[None]
    q = a * dx * dx + 2 * b * dx * dy + c * dy * dy
    al = jnp.minimum(opac * jnp.exp(-0.5 * q), ALPHA_MAX)
    al = jnp.where(al >= ALPHA_MIN, al, 0.0)
    al = jnp.where(depth >= NEAR, al, 0.0)
    keep = jnp.cumprod(1.0 - al, axis=1)
    t = jnp.concatenate([jnp.ones((h * w, 1)), keep[:, :-1]], axis=1)
    img = (al * t) @ colours
    if bg is not None:
        img = img + keep[:, -1:] * bg
    return img.reshape(h, w, -1)


def render(means, covs, colours, opac, bg, view, k, h, w):
    proj = project(means, covs, view, k)
    order = jnp.argsort(proj[:, 5], stable=True)
    return rasterize(proj[order], colours[order], opac[order], bg, h, w)


def rotation(rng):
    q, _ = np.linalg.qr(rng.randn(3, 3))
    return q * np.sign(np.linalg.det(q))


def arr(x):
    return {"shape": list(np.shape(x)), "data": np.ravel(np.asarray(x)).tolist()}


cases = []


def case(name, n, h, w, ch, background, behind=0, faint=0):
    means = rng.randn(n, 3) * [1.2, 0.8, 0.6]
    a = rng.randn(n, 3, 3) * 0.25
    covs = a @ np.swapaxes(a, 1, 2) + 0.01 * np.eye(3)
    colours = rng.rand(n, ch)
    opac = rng.uniform(0.1, 1.0, n)
    opac[:faint] = 0.002  # below 1/255: never drawn
    # A camera 4 units from the origin looking at it (view = [R | -R eye]).
    r = rotation(rng)
    eye = -4.0 * r[2]
    view = np.eye(4)
    view[:3, :3], view[:3, 3] = r, -r @ eye
    # Some Gaussians behind the near plane.
    for i in range(faint, faint + behind):
        means[i] = eye + r[2] * rng.uniform(-1.0, 0.1)
    f = 1.1 * max(h, w)
    # The op keeps its intrinsics as f32 attributes: use f32 values.
    k = tuple(float(np.float32(x)) for x in (f, 0.9 * f, w / 2 + 0.7, h / 2 - 0.4))
    bg = rng.rand(ch) if background else None
    proj = project(means, covs, view, k)
    img = render(means, covs, colours, opac, bg, view, k, h, w)
    wt = rng.randn(*img.shape)

    def loss(means, covs, colours, opac, bg, view):
        return jnp.sum(render(means, covs, colours, opac, bg, view, k, h, w) * wt)

    argnums = (0, 1, 2, 3, 5) + ((4,) if background else ())
    grads = jax.grad(loss, argnums=argnums)(means, covs, colours, opac, bg, view)
    c = {
        "name": name,
        "height": h,
        "width": w,
        "intrinsics": list(k),
        "means": arr(means),
        "covs": arr(covs),
        "colours": arr(colours),
        "opacities": arr(opac),
        "view": arr(view),
        "cotangent": arr(wt),
        "projected": arr(proj),
        "order": np.argsort(np.asarray(proj[:, 5]), kind="stable").tolist(),
        "image": arr(img),
    }
    for key, g in zip(["means", "covs", "colours", "opacities", "view", "background"], grads):
        c["grad_" + key] = arr(g)
    if background:
        c["background"] = arr(bg)
    cases.append(c)


case("scene_24_37x21_rgb_background", 24, 21, 37, 3, True, behind=2, faint=1)
case("scene_9_16x16_grey", 9, 16, 16, 1, False)
case("scene_40_35x33_rgb", 40, 33, 35, 3, False, behind=3, faint=2)

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "splat.json")
with open(out, "w") as f:
    json.dump({"generator": "gen_splat.py", "jax": jax.__version__, "cases": cases}, f, indent=None)
    f.write("\n")
print(f"wrote {len(cases)} cases to {out}")
