#!/usr/bin/env python3
"""qcnet_f64.py — the official QCNet's forward pass and training loss in float64 (NumPy), on a
parity fixture (tests/data/qcnet-parity-tiny): the noise floor against which fp32 results are
measured (issue 29, "Numerics"; docs/NUMERICS.md).

An independent re-implementation of docs/design/QCNET.md §3, §5 and §6.1 (it shares no code with
qctrain). It reads the fixture's batch, weights and the edge sets the official model handed each
attention layer (outputs.safetensors: edge_index.<layer>.call0), and computes every output in the
dtype asked for:

  --dtype float32   checks this script: its outputs must equal the official fp32 outputs within
                    the fixture's tolerance (1e-4 of the largest value; ~1e-6 is typical), or it
                    exits 1. Run before trusting a float64 figure.
  --dtype float64   the reference: writes OUT (safetensors, F64): pred.*, enc.*, loss.* under the
                    fixture's names, with metadata naming this script and the fixture's sha256.

Usage:  tools/qcnet_f64.py FIXTURE_DIR [--dtype float32|float64] [--out OUT] [--report]
  --report prints, for each output, max |official fp32 - float64| / max |float64| (PyTorch's own
  fp32 error), which the C test compares qctrain's fp32 error against.
"""
import argparse
import hashlib
import json
import math
import os
import struct
import sys

import numpy as np

ST_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "U8": np.uint8,
             "BOOL": np.bool_, "I32": np.int32}


def st_read(path):
    """A safetensors file as {name: ndarray} and its metadata."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    head = json.loads(blob[8:8 + n])
    meta = head.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, t in head.items():
        a, b = t["data_offsets"]
        arr = np.frombuffer(blob[base + a:base + b], dtype=ST_DTYPES[t["dtype"]])
        out[name] = arr.reshape(t["shape"]).copy()
    return out, meta


def st_write(path, tensors, meta):
    """Writes {name: float64 ndarray} atomically (temporary file, fsync, rename)."""
    head = {"__metadata__": meta}
    off = 0
    blobs = []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f8")
        head[name] = {"dtype": "F64", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Model:
    """QCNet's layers on weights W (a dict of arrays already in the working dtype)."""

    def __init__(self, W, cfg, dt, branches=None, f32ops=(), sides=None):
        self.W = W
        # Another fp32 implementation's edge features (edge_attr.<set>): its angles may sit on
        # the other side of ±π (atan2 of a cross product that cancels to within 1 ulp of zero
        # takes its sign from the last bit of cos/sin); the features are moved to its side.
        self.sides = sides or {}
        self.snapped = 0
        self.features = {}  # edge set -> the features its FourierEmbedding got
        self.f32ops = set(f32ops)
        self.dt = dt
        self.H = cfg["num_heads"]
        self.Dh = cfg["head_dim"]
        self.D = cfg["hidden_dim"]
        # Python float constants of the official code: rounded to fp32 in an fp32 run, exact
        # doubles in a float64 run (QCNET.md §0).
        self.pi = dt(math.pi)
        self.two_pi = dt(2 * math.pi)
        # Branches of the angle functions (wrap, atan2) that an fp32 run took, in call order:
        # recorded by an fp32 run (branches None -> record), followed by a float64 run.
        self.branches = branches
        self.recorded = []

    def branch(self, v):
        """v (an angle) on the branch the fp32 run took: wrap_angle and atan2 jump by 2π at ±π,
        and an input within rounding of the jump lands on either side (79 of the fixture's
        14,456 pl2pl edges have orientations exactly π apart). The float64 reference measures
        rounding error, so it follows the fp32 run's side: v ± 2π where the two differ by ~2π."""
        if self.branches is None:
            self.recorded.append(v)
            return v
        ref = self.branches[len(self.recorded)]
        self.recorded.append(ref)
        return v + np.round((ref - v) / (2 * math.pi)) * (2 * math.pi)

    def lo(self, op, fn, *args):
        """fn(*args) in the working dtype; for an op class of f32ops (--attribute), on the
        arguments rounded to fp32 and in fp32, the result back in the working dtype. fn uses
        Python float constants, which NumPy then takes in the arguments' precision."""
        if op not in self.f32ops:
            return fn(*args)
        r = fn(*[a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
                 for a in args])
        return r.astype(self.dt)

    def w(self, name):
        return self.W[name]

    # ---- §3.0 helpers ----
    def wrap(self, a):
        def f(a):
            pi, two_pi = a.dtype.type(math.pi), a.dtype.type(2 * math.pi)
            m = np.fmod(a + pi, two_pi)
            return -pi + np.where((m != 0) & (np.sign(m) != np.sign(two_pi)), m + two_pi, m)
        return self.branch(self.lo("geometry", f, a))

    def angle(self, c, n):
        def f(c, n):
            cross = c[:, 0] * n[:, 1] - c[:, 1] * n[:, 0]
            dot = (0.0 + c[:, 0] * n[:, 0]) + c[:, 1] * n[:, 1]
            return np.arctan2(cross, dot)
        return self.branch(self.lo("geometry", f, c, n))

    def norm2(self, v):
        return self.lo("geometry", lambda v: np.sqrt(v[:, 0] * v[:, 0] + v[:, 1] * v[:, 1]), v)

    def linear(self, x, p, bias=True):
        if bias:
            return self.lo("gemm", lambda x, w, b: x @ w.T + b, x, self.w(p + ".weight"),
                           self.w(p + ".bias"))
        return self.lo("gemm", lambda x, w: x @ w.T, x, self.w(p + ".weight"))

    def layernorm(self, x, p):
        def f(x, w, b):
            mu = x.mean(axis=-1, keepdims=True)
            var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
            return (x - mu) / np.sqrt(var + 1e-5) * w + b
        return self.lo("layernorm", f, x, self.w(p + ".weight"), self.w(p + ".bias"))

    @staticmethod
    def relu(x):
        return np.maximum(x, 0)

    def elu(self, x):
        return self.lo("activations", lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))), x)

    def sigmoid(self, x):
        return self.lo("activations", lambda x: 1 / (1 + np.exp(-x)), x)

    # ---- §3.1, §3.2 ----
    EDGE_SETS = {"r_pt2pl_emb": "pt2pl", "r_pl2pl_emb": "pl2pl", "r_t_emb": "t",
                 "r_pl2a_emb": "pl2a", "r_a2a_emb": "a2a", "r_t2m_emb": "t2m",
                 "r_pl2m_emb": "pl2m", "r_a2m_emb": "a2m"}

    def side(self, p, c):
        """c (an edge set's features) with the angle columns (1: angle_between, 2: wrap) on the
        side of ±π that self.sides' features of the set are on."""
        name = self.EDGE_SETS.get(p.rsplit(".", 1)[-1])
        ref = self.sides.get(name)
        if ref is None:
            return c
        c = c.copy()
        for col in (1, 2):
            k = np.round((ref[:, col].astype(np.float64) - c[:, col]) / (2 * math.pi))
            self.snapped += int((k != 0).sum())
            c[:, col] = c[:, col] + k.astype(c.dtype) * c.dtype.type(2 * math.pi)
        self.features[name] = c
        return c

    def fourier(self, p, c, cats=()):
        s = None
        if c is not None:
            c = self.side(p, c)
            wf = self.w(p + ".freqs.weight")
            def f(c, wf):
                theta = (c[:, :, None] * wf[None]) * 2 * math.pi
                return np.concatenate([np.cos(theta), np.sin(theta), c[:, :, None]], axis=-1)
            phi = self.lo("fourier", f, c, wf)
            for i in range(c.shape[1]):
                q = f"{p}.mlps.{i}"
                h = self.linear(phi[:, i], q + ".0")
                h = self.linear(self.relu(self.layernorm(h, q + ".1")), q + ".3")
                s = h if s is None else s + h
        if cats:
            e = cats[0]
            for x in cats[1:]:
                e = e + x
            s = e if s is None else s + e
        return self.linear(self.relu(self.layernorm(s, p + ".to_out.0")), p + ".to_out.2")

    def mlp(self, p, x):
        return self.linear(self.relu(self.layernorm(self.linear(x, p + ".mlp.0"), p + ".mlp.1")),
                           p + ".mlp.3")

    # ---- §3.3 ----
    def attention(self, p, x_src, x_dst, r, edges, bipartite):
        H, Dh = self.H, self.Dh
        src, dst = edges[0], edges[1]
        if bipartite:
            xd = self.layernorm(x_dst, p + ".attn_prenorm_x_dst")
            xs = self.layernorm(x_src, p + ".attn_prenorm_x_src")
        else:
            xd = xs = self.layernorm(x_dst, p + ".attn_prenorm_x_src")
        x0 = x_dst
        Nd = x_dst.shape[0]
        q = self.linear(xd, p + ".to_q").reshape(Nd, H, Dh)
        k = self.linear(xs, p + ".to_k", bias=False).reshape(-1, H, Dh)
        v = self.linear(xs, p + ".to_v").reshape(-1, H, Dh)
        kj = k[src]
        vj = v[src]
        if r is not None:
            rh = self.layernorm(r, p + ".attn_prenorm_r")
            kj = kj + self.linear(rh, p + ".to_k_r", bias=False).reshape(-1, H, Dh)
            vj = vj + self.linear(rh, p + ".to_v_r").reshape(-1, H, Dh)
        def softmax(qi, kj):
            s = (qi * kj).sum(-1) * Dh ** -0.5
            mx = np.full((Nd, H), -np.inf, dtype=s.dtype)
            np.maximum.at(mx, dst, s)
            ex = np.exp(s - mx[dst])
            den = np.zeros((Nd, H), dtype=s.dtype)
            np.add.at(den, dst, ex)
            return ex / (den[dst] + 1e-16)

        def aggregate(alpha, vj):
            agg = np.zeros((Nd, H, Dh), dtype=vj.dtype)
            np.add.at(agg, dst, alpha[:, :, None] * vj)
            return agg
        alpha = self.lo("softmax", softmax, q[dst], kj)
        agg = self.lo("aggregate", aggregate, alpha, vj)
        u = agg.reshape(Nd, H * Dh)
        g = self.sigmoid(self.linear(np.concatenate([u, xd], axis=1), p + ".to_g"))
        u = u + g * (self.linear(xd, p + ".to_s") - u)
        a = self.linear(u, p + ".to_out")
        x1 = x0 + self.layernorm(a, p + ".attn_postnorm")
        f = self.linear(self.layernorm(x1, p + ".ff_prenorm"), p + ".ff_mlp.0")
        f = self.linear(self.relu(f), p + ".ff_mlp.3")
        return x1 + self.layernorm(f, p + ".ff_postnorm")

    # ---- §3.4 ----
    def gru(self, p, y, h):
        wih, whh = self.w(p + ".weight_ih_l0"), self.w(p + ".weight_hh_l0")
        bih, bhh = self.w(p + ".bias_ih_l0"), self.w(p + ".bias_hh_l0")
        D = self.D

        def cell(x, h, wih, whh, bih, bhh):
            gi = x @ wih.T + bih
            gh = h @ whh.T + bhh
            r = 1 / (1 + np.exp(-(gi[:, :D] + gh[:, :D])))
            z = 1 / (1 + np.exp(-(gi[:, D:2 * D] + gh[:, D:2 * D])))
            n = np.tanh(gi[:, 2 * D:] + r * gh[:, 2 * D:])
            return (1 - z) * n + z * h
        for t in range(y.shape[0]):
            h = self.lo("gru", cell, y[t], h, wih, whh, bih, bhh)
        return h


def loss(batch, pred, cfg, dt):
    """QCNet's training loss (QCNET.md §6.1) of the outputs pred (pred.* arrays), in dtype dt."""
    T, Tf = cfg["num_historical_steps"], cfg["num_future_steps"]
    A = batch["agent.predict_mask"].shape[0]
    f = lambda a: a.astype(dt)  # noqa: E731
    loc_p, scale_p = f(pred["pred.loc_propose_pos"]), f(pred["pred.scale_propose_pos"])
    loc_r, scale_r = f(pred["pred.loc_refine_pos"]), f(pred["pred.scale_refine_pos"])
    pi = f(pred["pred.pi"])
    pm = batch["agent.predict_mask"]
    reg_mask = pm[:, T:].astype(dt)
    cls_mask = pm[:, T + Tf - 1].astype(dt)
    gt = f(batch["agent.target"][..., :2])
    l2 = np.sqrt(((loc_p - gt[:, None]) ** 2).sum(-1))
    best = np.argmin((l2 * reg_mask[:, None]).sum(-1), axis=1)

    def nll(mu, sigma, yv):
        return (np.log(2 * sigma) + np.abs(yv - mu) / sigma).sum(-1)

    ar = np.arange(A)

    def reg(loc, scale):
        L = nll(loc[ar, best], scale[ar, best], gt) * reg_mask
        return (L.sum(0) / np.maximum(1, reg_mask.sum(0))).mean()

    n = reg_mask[:, None, Tf - 1] * nll(loc_r[:, :, Tf - 1], scale_r[:, :, Tf - 1],
                                         gt[:, None, Tf - 1])
    lsm = pi - pi.max(1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(1, keepdims=True))
    z = lsm - n
    zm = z.max(1, keepdims=True)
    cls = -(zm[:, 0] + np.log(np.exp(z - zm).sum(1)))
    loss_cls = (cls * cls_mask).sum() / max(1, cls_mask.sum())
    lp, lr = reg(loc_p, scale_p), reg(loc_r, scale_r)
    return {"loss.reg_loss_propose": np.asarray(lp), "loss.reg_loss_refine": np.asarray(lr),
            "loss.cls_loss": np.asarray(loss_cls), "loss.loss": np.asarray(lp + lr + loss_cls),
            "loss.best_mode": best}


OP_CLASSES = ("geometry", "fourier", "gemm", "layernorm", "softmax", "aggregate", "activations",
              "gru", "cumsum", "loss")


def forward(batch, W, edges, cfg, dt, branches=None, f32ops=(), sides=None):
    """QCNet's forward and loss (QCNET.md §5, §6.1); every array in dtype dt. With branches (the
    "branches" output of an fp32 run), every angle takes the fp32 run's side of ±π."""
    m = Model(W, cfg, dt, branches, f32ops, sides)
    T, K, D = cfg["num_historical_steps"], cfg["num_modes"], cfg["hidden_dim"]
    Tf, R = cfg["num_future_steps"], cfg["num_recurrent_steps"]
    f = lambda a: a.astype(dt)  # noqa: E731
    out = {}

    # ---- §5.2 map encoder ----
    me = "encoder.map_encoder"
    pt_pos = f(batch["map_point.position"][:, :2])
    pt_ori = f(batch["map_point.orientation"])
    pl_pos = f(batch["map_polygon.position"][:, :2])
    pl_ori = f(batch["map_polygon.orientation"])
    P = pl_pos.shape[0]
    x_pt = m.fourier(me + ".x_pt_emb", f(batch["map_point.magnitude"])[:, None],
                     [m.w(me + ".type_pt_emb.weight")[batch["map_point.type"].astype(np.int64)],
                      m.w(me + ".side_pt_emb.weight")[batch["map_point.side"].astype(np.int64)]])
    x_pl = m.fourier(me + ".x_pl_emb", None,
                     [m.w(me + ".type_pl_emb.weight")[batch["map_polygon.type"].astype(np.int64)],
                      m.w(me + ".int_pl_emb.weight")[
                          batch["map_polygon.is_intersection"].astype(np.int64)]])
    out["enc.x_pt"] = x_pt

    e = edges[me + ".pt2pl_layers.0"]
    q, pp = e[0], e[1]
    u_p = np.stack([np.cos(pl_ori), np.sin(pl_ori)], axis=1)
    rel = pt_pos[q] - pl_pos[pp]
    r_pt2pl = m.fourier(me + ".r_pt2pl_emb", np.stack(
        [m.norm2(rel), m.angle(u_p[pp], rel), m.wrap(pt_ori[q] - pl_ori[pp])], axis=1))
    e_pl = edges[me + ".pl2pl_layers.0"]
    j, i = e_pl[0], e_pl[1]
    typed = batch["map_polygon__to__map_polygon.edge_index"]
    ttype = batch["map_polygon__to__map_polygon.type"].astype(np.int64)
    key = {}
    for a, b, t in zip(typed[0], typed[1], ttype):
        key[(int(a), int(b))] = max(key.get((int(a), int(b)), 0), int(t))
    etype = np.array([key.get((int(a), int(b)), 0) for a, b in zip(j, i)], dtype=np.int64)
    rel = pl_pos[j] - pl_pos[i]
    r_pl2pl = m.fourier(me + ".r_pl2pl_emb", np.stack(
        [m.norm2(rel), m.angle(u_p[i], rel), m.wrap(pl_ori[j] - pl_ori[i])], axis=1),
        [m.w(me + ".type_pl2pl_emb.weight")[etype]])
    x_pl = m.attention(me + ".pt2pl_layers.0", x_pt, x_pl, r_pt2pl, e, True)
    x_pl = m.attention(me + ".pl2pl_layers.0", None, x_pl, r_pl2pl, e_pl, False)
    out["enc.x_pl_last"] = x_pl

    # ---- §5.3 agent encoder ----
    ae = "encoder.agent_encoder"
    pos = f(batch["agent.position"][:, :T, :2])
    head = f(batch["agent.heading"][:, :T])
    vel = f(batch["agent.velocity"][:, :T, :2])
    A = pos.shape[0]
    hv = np.stack([np.cos(head), np.sin(head)], axis=-1)
    dmot = np.concatenate([np.zeros_like(pos[:, :1]), pos[:, 1:] - pos[:, :-1]], axis=1)
    fl = lambda a: a.reshape(A * T, -1)  # noqa: E731
    c = np.stack([m.norm2(fl(dmot)), m.angle(fl(hv), fl(dmot)), m.norm2(fl(vel)),
                  m.angle(fl(hv), fl(vel))], axis=1)
    atype = np.repeat(batch["agent.type"].astype(np.int64), T)
    x_a = m.fourier(ae + ".x_a_emb", c, [m.w(ae + ".type_a_emb.weight")[atype]])
    P_am, H_am, Th_am = fl(pos), fl(hv), head.reshape(-1)  # agent-major rows a*T + t

    et = edges[ae + ".t_attn_layers.0"]
    s_, t_ = et[0], et[1]
    rel = P_am[s_] - P_am[t_]
    r_t = m.fourier(ae + ".r_t_emb", np.stack(
        [m.norm2(rel), m.angle(H_am[t_], rel), m.wrap(Th_am[s_] - Th_am[t_]),
         (s_ - t_).astype(dt)], axis=1))
    # time-major agent-steps: row t*A + a
    P_tm = pos.transpose(1, 0, 2).reshape(T * A, 2)
    H_tm = hv.transpose(1, 0, 2).reshape(T * A, 2)
    Th_tm = head.T.reshape(-1)
    epa = edges[ae + ".pl2a_attn_layers.0"]
    ps, ad = epa[0] % P, epa[1]
    rel = pl_pos[ps] - P_tm[ad]
    r_pl2a = m.fourier(ae + ".r_pl2a_emb", np.stack(
        [m.norm2(rel), m.angle(H_tm[ad], rel), m.wrap(pl_ori[ps] - Th_tm[ad])], axis=1))
    eaa = edges[ae + ".a2a_attn_layers.0"]
    bs, ad2 = eaa[0], eaa[1]
    rel = P_tm[bs] - P_tm[ad2]
    r_a2a = m.fourier(ae + ".r_a2a_emb", np.stack(
        [m.norm2(rel), m.angle(H_tm[ad2], rel), m.wrap(Th_tm[bs] - Th_tm[ad2])], axis=1))
    X_pl_t = np.tile(x_pl, (T, 1))
    for li in range(cfg["num_agent_layers"]):
        x_a = m.attention(f"{ae}.t_attn_layers.{li}", None, x_a, r_t,
                          edges[f"{ae}.t_attn_layers.{li}"], False)
        x_a = x_a.reshape(A, T, D).transpose(1, 0, 2).reshape(T * A, D)
        x_a = m.attention(f"{ae}.pl2a_attn_layers.{li}", X_pl_t, x_a, r_pl2a,
                          edges[f"{ae}.pl2a_attn_layers.{li}"], True)
        x_a = m.attention(f"{ae}.a2a_attn_layers.{li}", None, x_a, r_a2a,
                          edges[f"{ae}.a2a_attn_layers.{li}"], False)
        x_a = x_a.reshape(T, A, D).transpose(1, 0, 2).reshape(A * T, D)
    out["enc.x_a"] = x_a.reshape(A, T, D)

    # ---- §5.4 decoder ----
    de = "decoder"
    x_m, th_m = pos[:, T - 1], head[:, T - 1]
    h_m = np.stack([np.cos(th_m), np.sin(th_m)], axis=1)
    x_t = x_a
    X_pl = np.tile(x_pl, (K, 1))
    X_a = np.tile(x_a.reshape(A, T, D)[:, T - 1], (K, 1))
    mq = np.tile(m.w(de + ".mode_emb.weight"), (A, 1))

    e2 = edges[de + ".t2m_propose_attn_layers.0"]
    sa, st = e2[0] // T, e2[0] % T
    rel = pos[sa, st] - x_m[sa]
    r_t2m = m.fourier(de + ".r_t2m_emb", np.stack(
        [m.norm2(rel), m.angle(h_m[sa], rel), m.wrap(head[sa, st] - th_m[sa]),
         (st - T + 1).astype(dt)], axis=1))
    e3 = edges[de + ".pl2m_propose_attn_layers.0"]
    pp3, aa3 = e3[0] % P, e3[1] % A
    rel = pl_pos[pp3] - x_m[aa3]
    r_pl2m = m.fourier(de + ".r_pl2m_emb", np.stack(
        [m.norm2(rel), m.angle(h_m[aa3], rel), m.wrap(pl_ori[pp3] - th_m[aa3])], axis=1))
    e4 = edges[de + ".a2m_propose_attn_layers.0"]
    bb4, aa4 = e4[0] % A, e4[1] % A
    rel = x_m[bb4] - x_m[aa4]
    r_a2m = m.fourier(de + ".r_a2m_emb", np.stack(
        [m.norm2(rel), m.angle(h_m[aa4], rel), m.wrap(th_m[bb4] - th_m[aa4])], axis=1))

    def layers(kind, mq):
        for li in range(cfg["num_dec_layers"]):
            mq = m.attention(f"{de}.t2m_{kind}_attn_layers.{li}", x_t, mq, r_t2m,
                             edges[f"{de}.t2m_{kind}_attn_layers.{li}"], True)
            mq = mq.reshape(A, K, D).transpose(1, 0, 2).reshape(K * A, D)
            mq = m.attention(f"{de}.pl2m_{kind}_attn_layers.{li}", X_pl, mq, r_pl2m,
                             edges[f"{de}.pl2m_{kind}_attn_layers.{li}"], True)
            mq = m.attention(f"{de}.a2m_{kind}_attn_layers.{li}", X_a, mq, r_a2m,
                             edges[f"{de}.a2m_{kind}_attn_layers.{li}"], True)
            mq = mq.reshape(K, A, D).transpose(1, 0, 2).reshape(A * K, D)
        return m.attention(f"{de}.m2m_{kind}_attn_layer", None, mq, None,
                           edges[f"{de}.m2m_{kind}_attn_layer"], False)

    locs, scales = [], []
    for _ in range(R):
        mq = layers("propose", mq)
        M = mq.reshape(A, K, D)
        locs.append(m.mlp(de + ".to_loc_propose_pos", M))
        scales.append(m.mlp(de + ".to_scale_propose_pos", M))
    def cumsum(x):  # PyTorch's CPU cumsum accumulates fp32 in double
        return np.cumsum(x, axis=2, dtype=np.float64).astype(x.dtype)
    loc_p = m.lo("cumsum", cumsum, np.concatenate(locs, axis=-1).reshape(A, K, Tf, 2))
    scale_p = m.lo("cumsum", cumsum,
                   m.elu(np.concatenate(scales, axis=-1).reshape(A, K, Tf, 2)) + 1) + dt(0.1)

    y = m.fourier(de + ".y_emb", loc_p.reshape(-1, 2))
    y = y.reshape(A * K, Tf, D).transpose(1, 0, 2)
    h0 = np.broadcast_to(m.w(de + ".traj_emb_h0"), (A * K, D))
    mq = m.gru(de + ".traj_emb", y, h0)
    mq = layers("refine", mq)
    M = mq.reshape(A, K, D)
    loc_r = m.mlp(de + ".to_loc_refine_pos", M).reshape(A, K, Tf, 2) + loc_p
    scale_r = (m.elu(m.mlp(de + ".to_scale_refine_pos", M).reshape(A, K, Tf, 2)) + 1) + dt(0.1)
    pi = m.mlp(de + ".to_pi", M)[..., 0]
    out.update({"pred.loc_propose_pos": loc_p, "pred.scale_propose_pos": scale_p,
                "pred.loc_refine_pos": loc_r, "pred.scale_refine_pos": scale_r, "pred.pi": pi})

    if "loss" in m.f32ops:
        lo = loss(batch, {k: v.astype(np.float32) for k, v in out.items()}, cfg, np.float32)
        out.update({k: v if k == "loss.best_mode" else v.astype(dt) for k, v in lo.items()})
    else:
        out.update(loss(batch, out, cfg, dt))
    out["branches"] = m.recorded
    out["snapped"] = m.snapped
    out["features"] = m.features
    return out


def rel_err(a, ref):
    """max |a - ref| / max |ref|."""
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    scale = np.abs(ref).max()
    return float(np.abs(a - ref).max() / scale) if scale > 0 else float(np.abs(a - ref).max())


def rms_err(a, ref):
    """||a - ref||_2 / ||ref||_2: every element counts, so it is steadier than the max, which
    depends on the one element that happened to round worst."""
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    scale = np.sqrt((ref * ref).sum())
    d = np.sqrt(((a - ref) ** 2).sum())
    return float(d / scale) if scale > 0 else float(d)


def load_case(fx, ours_name):
    """A case folder's batch, weights, configuration, edge sets and fp32 outputs (official,
    ours: None when absent)."""
    def load(name):
        try:
            return st_read(os.path.join(fx, name))[0]
        except (OSError, ValueError, KeyError, struct.error) as e:
            sys.exit(f"qcnet_f64: {os.path.join(fx, name)}: not a safetensors file ({e})")

    try:
        with open(os.path.join(fx, "manifest.json")) as fh:
            cfg = json.load(fh)["config"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"qcnet_f64: {fx}/manifest.json: no model configuration ({e})")
    official = (load("outputs.safetensors")
                if os.path.exists(os.path.join(fx, "outputs.safetensors")) else None)
    ours = load(ours_name) if ours_name else None
    src = official if official is not None else ours
    if src is None:
        sys.exit(f"qcnet_f64: {fx}: no edge sets (outputs.safetensors, or --ours)")
    pre = "edge_index."
    edges = {k[len(pre):-len(".call0")]: v for k, v in src.items() if k.startswith(pre)}
    return load("batch.safetensors"), load("weights.safetensors"), cfg, edges, official, ours


def sides_of(ours):
    """The edge features of an implementation's output file (edge_attr.<set>), or None."""
    if ours is None:
        return None
    pre = "edge_attr."
    return {k[len(pre):]: v for k, v in ours.items() if k.startswith(pre)} or None


def evaluate(fx, ours_name):
    """One case: float32 and float64 forward; per implementation (column) and output, the
    distance from float64, and for each loss its error in fp32 ulps split into the loss's own
    arithmetic (the implementation's fp32 loss minus the float64 loss of its own fp32 outputs)
    and what its outputs' errors carry in (the rest)."""
    batch, W, cfg, edges, official, ours = load_case(fx, ours_name)
    sides = sides_of(ours)
    out32 = forward(batch, {k: v.astype(np.float32) for k, v in W.items()}, edges, cfg,
                    np.float32, sides=sides)
    out = forward(batch, {k: v.astype(np.float64) for k, v in W.items()}, edges, cfg,
                  np.float64, out32["branches"], sides=sides)
    names = [k for k in out32 if k not in ("loss.best_mode", "branches", "snapped", "features")]
    cols = ([("qctrain", ours)] if ours is not None else []) + [("plain fp32", out32)] + (
        [("official", official)] if official is not None else [])
    dist = {c: {k: (rms_err(v[k], out[k]), rel_err(v[k], out[k])) for k in names}
            for c, v in cols}
    ulps = {}
    for c, v in cols:
        own = loss(batch, v, cfg, np.float64)
        for k in (n for n in names if n.startswith("loss.")):
            ulp = float(np.spacing(np.float32(abs(float(out[k])))))
            tot, ari = float(v[k]) - float(out[k]), float(v[k]) - float(own[k])
            ulps.setdefault(c, {})[k] = (tot / ulp, ari / ulp)
    best = {c: int((np.asarray(v["loss.best_mode"]) == out["loss.best_mode"]).sum())
            for c, v in cols}
    feat = max((float(np.abs(sides[k] - v).max()) for k, v in out32["features"].items()),
               default=0.0)
    return (out, names, [c for c, _ in cols], dist, ulps, best, len(out["loss.best_mode"]),
            out32["snapped"], feat)


def attribute(cases, ours_name):
    """Prints, per op class, the rms distance from float64 of a few outputs (and the loss's
    distance in ulps) when only that class runs in fp32 (median over the cases); "all" runs every
    class in fp32. Ops outside the classes
    (residual adds, the gate's blend, concatenations, embedding sums) stay in float64."""
    cols = ["enc.x_a", "pred.loc_propose_pos", "pred.loc_refine_pos", "pred.scale_refine_pos",
            "pred.pi"]
    res = {}
    for fx in cases:
        batch, W, cfg, edges, _, ours = load_case(fx, ours_name)
        sides = sides_of(ours)
        w64 = {k: v.astype(np.float64) for k, v in W.items()}
        out32 = forward(batch, {k: v.astype(np.float32) for k, v in W.items()}, edges, cfg,
                        np.float32, sides=sides)
        ref = forward(batch, w64, edges, cfg, np.float64, out32["branches"], sides=sides)
        for c in OP_CLASSES + ("all",):
            ops = OP_CLASSES if c == "all" else (c,)
            o = forward(batch, w64, edges, cfg, np.float64, out32["branches"], ops, sides)
            ulp = float(np.spacing(np.float32(abs(float(ref["loss.loss"])))))
            res.setdefault(c, []).append([rms_err(o[k], ref[k]) for k in cols] +
                                         [abs(float(o["loss.loss"]) - float(ref["loss.loss"]))
                                          / ulp])
    print("distance from float64 (rms) with one op class in fp32"
          + ("" if len(cases) == 1 else f" (median over {len(cases)} cases)") + ":")
    print(f"{'op class':12s}" + "".join(f"{k.split('.')[1][:16]:>17s}" for k in cols) +
          f"{'loss (ulp)':>12s}")
    for c, rows in res.items():
        med = np.median(np.array(rows), axis=0)
        print(f"{c:12s}" + "".join(f"{e:17.3e}" for e in med[:-1]) + f"{med[-1]:12.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", help="case folders: batch, weights, manifest.json, and "
                    "the edge sets in outputs.safetensors or in --ours")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    ap.add_argument("--out", help="write the float64 outputs here (safetensors, F64; one case)")
    ap.add_argument("--ours", help="a file of each case folder holding another implementation's "
                    "fp32 outputs under the same names (qctrain bench numerics writes "
                    "qctrain.safetensors): its distance from float64 is printed beside the others")
    ap.add_argument("--attribute", action="store_true",
                    help="per op class, the outputs' distance from float64 when only that class "
                    "runs in fp32 (its inputs rounded to fp32): where fp32 error comes from")
    ap.add_argument("--report", action="store_true",
                    help="print each output's distance from float64 (max |x - f64| / max |f64|)")
    args = ap.parse_args()
    if args.out and len(args.cases) != 1:
        sys.exit("qcnet_f64: --out takes one case folder")
    if args.dtype == "float32":
        for fx in args.cases:
            batch, W, cfg, edges, official, _ = load_case(fx, None)
            if official is None:
                sys.exit(f"qcnet_f64: {fx}: --dtype float32 checks against outputs.safetensors, "
                         "which this case has not")
            out32 = forward(batch, {k: v.astype(np.float32) for k, v in W.items()}, edges, cfg,
                            np.float32)
            names = [k for k in out32
                     if k not in ("loss.best_mode", "branches", "snapped", "features")]
            worst = max(rel_err(out32[k], official[k]) for k in names)
            for k in names:
                print(f"{k:28s} {rel_err(out32[k], official[k]):.3e}")
            same = bool((out32["loss.best_mode"] == official["loss.best_mode"]).all())
            print(f"worst {worst:.3e}, best_mode {'equal' if same else 'DIFFERS'}")
            if worst > 1e-4 or not same:
                sys.exit(1)
        return
    if args.attribute:
        attribute(args.cases, args.ours)
        return
    runs = [evaluate(fx, args.ours) for fx in args.cases]
    if args.report or args.ours:
        _, names, cols, _, _, _, _, _, _ = runs[0]
        last = cols[-1]
        n = len(runs)
        what = "per output" if n == 1 else f"per output, median over {n} cases"
        metrics = ("rms: ||x - f64|| / ||f64||", "max: max |x - f64| / max |f64|")
        for j, metric in enumerate(metrics):
            print(f"distance from float64, {metric} {what}:")
            print(f"{'output':26s}" + "".join(f"{c:>12s}" for c in cols) +
                  (f"   qctrain / {last}" if args.ours else ""))
            for k in names:
                med = [float(np.median([r[3][c][k][j] for r in runs])) for c in cols]
                line = f"{k:26s}" + "".join(f"{e:12.3e}" for e in med)
                if args.ours:
                    line += f"   {med[0] / max(med[-1], 2.0 ** -24):.2f}"
                print(line)
        print("losses in fp32 ulps from float64, total = own arithmetic + carried from the outputs"
              + ("" if n == 1 else f"; median of |total| over {n} cases, then the medians of the"
                 " parts' sizes"))
        for k in (k for k in names if k.startswith("loss.")):
            line = f"{k:26s}"
            for c in cols:
                if n == 1:
                    tot, ari = runs[0][4][c][k]
                    line += f"  {c}: {tot:+7.2f} = {ari:+6.2f} {tot - ari:+7.2f}"
                else:
                    tot = float(np.median([abs(r[4][c][k][0]) for r in runs]))
                    ari = float(np.median([abs(r[4][c][k][1]) for r in runs]))
                    car = float(np.median([abs(r[4][c][k][0] - r[4][c][k][1]) for r in runs]))
                    line += f"  {c}: {tot:6.2f} ({ari:5.2f}, {car:6.2f})"
            print(line)
        if args.ours:
            print(f"edge features: qctrain's equal this fp32 reference's within "
                  f"{max(r[8] for r in runs):.3g} (the inputs of the Fourier embeddings)")
        snapped = sum(r[7] for r in runs)
        if snapped:
            print(f"{snapped} edge angle(s) moved by 2π to qctrain's side of ±π (a cross "
                  "product within rounding of zero: the side is not a numerics figure)")
        for c in cols:
            same = sum(r[5][c] for r in runs)
            print(f"best_mode: {c}'s equals float64's for {same} of {sum(r[6] for r in runs)} "
                  "agents")
    if args.out:
        out, names = runs[0][0], runs[0][1]
        sha = hashlib.sha256()
        for part in ("batch", "weights", "outputs"):
            path = os.path.join(args.cases[0], part + ".safetensors")
            if os.path.exists(path):
                with open(path, "rb") as fh:
                    sha.update(fh.read())
        st_write(args.out, {k: out[k] for k in names},
                 {"producer": "tools/qcnet_f64.py (NumPy float64, QCNET.md §5-§6.1)",
                  "fixture_sha256": sha.hexdigest(), "numpy": np.__version__})


if __name__ == "__main__":
    main()
