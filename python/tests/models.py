"""The model corpus: small models written with `tvm.relax.frontend.nn`, each with the input
specs of its `forward`. Used by `test_models.py` (kiln's build against TVM's) and by
`python/bench_models.py` (build and run time)."""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend import nn


class MLP(nn.Module):
    """Two linear layers with a ReLU between them."""

    def __init__(self, d_in=256, d_hidden=512, d_out=128):
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(nn.relu(self.fc1(x)))


class GPT2Block(nn.Module):
    """A GPT-2 transformer block: layer norm, causal self-attention with softmax, layer norm,
    a GELU MLP, and both residuals."""

    def __init__(self, d=128, heads=4, seq=32):
        self.d, self.heads, self.seq = d, heads, seq
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d, h = 1, self.seq, self.d, self.heads
        hd = d // h
        y = self.ln1(x)
        qkv = nn.reshape(self.qkv(y), (b, s, 3, h, hd))
        qkv = nn.permute_dims(qkv, (2, 0, 3, 1, 4))  # 3, b, h, s, hd
        q, k, v = nn.split(qkv, 3, axis=0)
        q = nn.reshape(q, (b, h, s, hd))
        k = nn.reshape(k, (b, h, s, hd))
        v = nn.reshape(v, (b, h, s, hd))
        att = nn.matmul(q, nn.permute_dims(k, (0, 1, 3, 2))) * (1.0 / float(np.sqrt(hd)))
        mask = nn.triu(nn.full((s, s), -1e9, dtype="float32"), diagonal=1)
        att = nn.softmax(att + mask, axis=-1)
        y = nn.matmul(att, v)  # b, h, s, hd
        y = nn.reshape(nn.permute_dims(y, (0, 2, 1, 3)), (b, s, d))
        x = x + self.proj(y)
        x = x + self.out(nn.gelu(self.fc(self.ln2(x))))
        return x


class BatchNorm(nn.Module):
    """Inference-time batch norm over axis 1 (Relax's `nn.batch_norm`, `training=False`), as
    the ONNX and PyTorch importers emit it; `nn` has no module for it."""

    def __init__(self, c, eps=1e-5):
        self.gamma = nn.Parameter((c,), "float32")
        self.beta = nn.Parameter((c,), "float32")
        self.moving_mean = nn.Parameter((c,), "float32")
        self.moving_var = nn.Parameter((c,), "float32")
        self.eps = eps

    def forward(self, x):
        out = relax.op.nn.batch_norm(
            x._expr,
            self.gamma._expr,
            self.beta._expr,
            self.moving_mean._expr,
            self.moving_var._expr,
            axis=1,
            epsilon=self.eps,
            training=False,
        )
        return nn.wrap_nested(relax.TupleGetItem(out, 0), name="batch_norm")


class ResNetBlock(nn.Module):
    """A ResNet basic block: conv3x3, batch norm, ReLU, conv3x3, batch norm, the residual, ReLU."""

    def __init__(self, c=32):
        self.conv1 = nn.Conv2D(c, c, 3, padding=1, bias=False)
        self.bn1 = BatchNorm(c)
        self.conv2 = nn.Conv2D(c, c, 3, padding=1, bias=False)
        self.bn2 = BatchNorm(c)

    def forward(self, x):
        y = nn.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return nn.relu(y + x)


class LSTMCell(nn.Module):
    """One LSTM step: gates from the input and the hidden state, sigmoid and tanh, the new
    cell and hidden states."""

    def __init__(self, d_in=128, d_hidden=128):
        self.h = d_hidden
        self.wi = nn.Linear(d_in, 4 * d_hidden)
        self.wh = nn.Linear(d_hidden, 4 * d_hidden)

    def forward(self, x, h, c):
        gates = self.wi(x) + self.wh(h)
        i, f, g, o = nn.split(gates, 4, axis=1)
        i, f, o = nn.sigmoid(i), nn.sigmoid(f), nn.sigmoid(o)
        g = nn.tanh(g)
        c2 = f * c + i * g
        h2 = o * nn.tanh(c2)
        return h2, c2


def f32(*shape):
    return nn.spec.Tensor(shape, "float32")


#: name -> (module factory, forward's input specs)
MODELS = {
    "mlp": (lambda: MLP(), {"x": f32(8, 256)}),
    "gpt2_block": (lambda: GPT2Block(), {"x": f32(1, 32, 128)}),
    "resnet_block": (lambda: ResNetBlock(), {"x": f32(1, 32, 28, 28)}),
    "lstm_cell": (lambda: LSTMCell(), {"x": f32(4, 128), "h": f32(4, 128), "c": f32(4, 128)}),
}


def export(name):
    """The model's Relax IRModule, its parameter specs, and random inputs and parameters
    (seeded), as numpy arrays."""
    factory, specs = MODELS[name]
    mod, params = factory().export_tvm({"forward": specs})
    rng = np.random.default_rng(0)

    def rand(shape):
        return (rng.standard_normal([int(d) for d in shape]) * 0.5).astype("float32")

    inputs = [rand(s.shape) for s in specs.values()]
    weights = []
    for pname, p in params:
        w = rand(p.shape)
        if "var" in pname:  # batch norm's running variance must be positive
            w = np.abs(w) + 0.5
        weights.append(w)
    return mod, inputs, weights
