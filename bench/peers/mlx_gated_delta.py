"""Peer: mlx-lm's gated_delta_ops (the ops-based per-token loop that mlx-lm runs on a CPU)
under mlx's autodiff (mx.value_and_grad), fp32, mlx's CPU device.

gated_delta_ops takes the linear decay and no scale: we pass exp(g) (so the gradient reaches
the log decay g, as in gdr) and q * Dk^-0.5. Hv / Hk > 1 is handled by mlx-lm (mx.repeat).

Usage: python bench/peers/mlx_gated_delta.py --T 512 [--check] [--json out.json]
"""

import mlx.core as mx
import numpy as np

from common import emit, measure, parser, rss_bytes

from mlx_lm.models.gated_delta import gated_delta_ops


def inputs(B, T, Hk, Hv, Dk, Dv, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, Hk, Dk), dtype=np.float32)
    k = rng.standard_normal((B, T, Hk, Dk), dtype=np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, Hv, Dv), dtype=np.float32)
    g = (-0.2 * rng.random((B, T, Hv))).astype(np.float32)
    beta = rng.random((B, T, Hv)).astype(np.float32)
    dout = rng.standard_normal((B, T, Hv, Dv), dtype=np.float32)
    return [mx.array(x) for x in (q, k, v, g, beta, dout)]


def loss_fn(dout, scale):
    def loss(q, k, v, g, beta):
        y, _ = gated_delta_ops(q * scale, k, v, mx.exp(g), beta)
        return mx.sum(y * dout)
    return loss


def check(seed):
    """Gradient of q at one element against a central difference (float32, small shape)."""
    q, k, v, g, beta, dout = inputs(1, 12, 1, 2, 8, 8, seed)
    f = loss_fn(dout, 8 ** -0.5)
    _, grads = mx.value_and_grad(f, argnums=(0, 1, 2, 3, 4))(q, k, v, g, beta)
    h = 1e-2
    e = np.zeros(q.shape, dtype=np.float32)
    e[0, 5, 0, 3] = h
    fd = (f(q + mx.array(e), k, v, g, beta) - f(q - mx.array(e), k, v, g, beta)).item() / (2 * h)
    got = grads[0][0, 5, 0, 3].item()
    err = abs(got - fd) / max(abs(fd), 1e-6)
    if not err < 1e-2:
        raise SystemExit(f"mlx_gated_delta: gradient check failed: {got} vs {fd}")
    return err


def main():
    args = parser(__doc__).parse_args()
    mx.set_default_device(mx.cpu)
    check_err = check(args.seed) if args.check else None
    q, k, v, g, beta, dout = inputs(args.B, args.T, args.Hk, args.Hv, args.dk, args.dv, args.seed)
    mx.eval(q, k, v, g, beta, dout)
    grad = mx.value_and_grad(loss_fn(dout, args.dk ** -0.5), argnums=(0, 1, 2, 3, 4))
    baseline = rss_bytes()

    def step():
        loss, grads = grad(q, k, v, g, beta)
        mx.eval(loss, *grads)

    seconds, samples = measure(step, args.repeats)
    extra = {"check_rel_error_fd": check_err, "mlx_peak_memory_bytes": mx.get_peak_memory()}
    import mlx_lm
    emit(args, "mlx_lm_gated_delta_ops_autodiff",
         {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__}, seconds, samples, baseline, extra)


if __name__ == "__main__":
    main()
