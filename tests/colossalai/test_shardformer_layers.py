"""megalith.shardformer.layer: ColossalAI's parallel layers, each built from a torch module
by `from_native_module`, give the torch module's forward and its input and weight
gradients on 2 and 3 CPU ranks (fresh random inputs, the same on every rank); the model
zoo's `simple_tp_mlp` pattern (Linear1D_Col then Linear1D_Row) trains like torch; and
ShardFormer.optimize shards a GPT-2 that then gives the plain model's logits."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.testing import assert_close

import megalith_comm as comm
from megalith.shardformer import ShardConfig, ShardFormer
from megalith.shardformer.layer import (
    DropoutForParallelInput,
    DropoutForReplicatedInput,
    Embedding1D,
    FusedLayerNorm,
    FusedRMSNorm,
    GPT2FusedLinearConv1D_Col,
    GPT2FusedLinearConv1D_Row,
    LayerNorm,
    Linear1D_Col,
    Linear1D_Row,
    VocabParallelEmbedding1D,
)
from megalith.testing import run_distributed

TP_SIZES = [2, 3]


def _shard(t: torch.Tensor, dim: int, rank: int, tp: int) -> torch.Tensor:
    return t.chunk(tp, dim=dim)[rank]


def _grads_match(layer: nn.Module, ref: nn.Module, x, x_ref, out, out_ref, pick) -> None:
    """Backward of a random projection of both outputs; input grads equal, and each
    parameter's grad equals pick(name, ref grad) (this rank's shard of the reference)."""
    g = torch.randn_like(out_ref)
    (out_ref * g).sum().backward()
    (out * pick("out", g)).sum().backward()
    assert_close(x.grad, pick("x", x_ref.grad))
    for name, p in layer.named_parameters():
        assert_close(p.grad, pick(name, dict(ref.named_parameters())[name].grad))


def check_linears(rank: int) -> None:
    tp = comm.get_world().world_size
    torch.manual_seed(100 + tp)
    h, f = 4 * 3, 6 * 3
    ref_col, ref_row = nn.Linear(h, f), nn.Linear(f, h)
    x_ref = torch.randn(5, 7, h, requires_grad=True)

    # Column, gathered output: the full result on every rank.
    col = Linear1D_Col.from_native_module(copy.deepcopy(ref_col), None, gather_output=True)
    x = x_ref.detach().clone().requires_grad_()
    out, out_ref = col(x), ref_col(x_ref)
    assert_close(out, out_ref)
    _grads_match(
        col,
        ref_col,
        x,
        x_ref,
        out,
        out_ref,
        lambda n, t: t if n in ("x", "out") else _shard(t, 0, rank, tp),
    )

    # Row with a full input (parallel_input=False) after a column without gathering.
    x_ref.grad = None
    for m in (ref_col, ref_row):
        m.zero_grad()
    col = Linear1D_Col.from_native_module(copy.deepcopy(ref_col), [None], overlap=True)
    row = Linear1D_Row.from_native_module(copy.deepcopy(ref_row), None, parallel_input=True)
    x = x_ref.detach().clone().requires_grad_()
    mid = col(x)
    assert_close(mid, _shard(ref_col(x_ref), -1, rank, tp))
    out, out_ref = row(mid), ref_row(ref_col(x_ref))
    assert_close(out, out_ref)
    g = torch.randn_like(out_ref)
    (out_ref * g).sum().backward()
    (out * g).sum().backward()
    assert_close(x.grad, x_ref.grad)
    assert_close(row.weight.grad, _shard(ref_row.weight.grad, 1, rank, tp))
    assert_close(row.bias.grad, ref_row.bias.grad)
    assert_close(col.weight.grad, _shard(ref_col.weight.grad, 0, rank, tp))

    # Row alone, input split by the layer; skip_bias_add hands the bias back.
    row = Linear1D_Row.from_native_module(
        copy.deepcopy(ref_row), None, parallel_input=False, skip_bias_add=True
    )
    z_ref = torch.randn(3, f, requires_grad=True)
    z = z_ref.detach().clone().requires_grad_()
    y, b = row(z)
    assert_close(y + b, ref_row(z_ref))
    (ref_row(z_ref) ** 2).sum().backward()
    ((y + b) ** 2).sum().backward()
    assert_close(z.grad, z_ref.grad)

    # The state dict holds full tensors; a fresh layer loads them back.
    full = col.state_dict()
    assert_close(full["weight"], ref_col.weight.detach())
    fresh = Linear1D_Col(h, f, process_group=None)
    fresh.load_state_dict(full)
    assert_close(fresh.weight, col.weight)


def check_sequence_parallel(rank: int) -> None:
    tp = comm.get_world().world_size
    torch.manual_seed(200 + tp)
    h, f, s = 6, 12, 3 * tp
    ref = nn.Sequential(nn.Linear(h, f), nn.GELU(), nn.Linear(f, h))
    kw = {"seq_parallel_mode": "split_gather", "seq_parallel_dim": 1}
    col = Linear1D_Col.from_native_module(copy.deepcopy(ref[0]), None, **kw)
    row = Linear1D_Row.from_native_module(copy.deepcopy(ref[2]), None, **kw)
    x_ref = torch.randn(2, s, h, requires_grad=True)
    x = _shard(x_ref.detach(), 1, rank, tp).clone().requires_grad_()
    out, out_ref = row(nn.functional.gelu(col(x))), ref(x_ref)
    assert_close(out, _shard(out_ref, 1, rank, tp))
    g = torch.randn_like(out_ref)
    (out_ref * g).sum().backward()
    (out * _shard(g, 1, rank, tp)).sum().backward()
    assert_close(x.grad, _shard(x_ref.grad, 1, rank, tp))
    assert_close(col.weight.grad, _shard(ref[0].weight.grad, 0, rank, tp))
    assert_close(row.weight.grad, _shard(ref[2].weight.grad, 1, rank, tp))
    assert_close(row.bias.grad, ref[2].bias.grad)


def check_embeddings(rank: int) -> None:
    tp = comm.get_world().world_size
    torch.manual_seed(300 + tp)
    ref = nn.Embedding(50, 6 * tp, padding_idx=7)  # 50 rows: padded to a multiple of 64 * tp
    ids = torch.randint(0, 50, (4, 9))
    ids[0, 0] = 7
    vocab = VocabParallelEmbedding1D.from_native_module(copy.deepcopy(ref), None)
    out, out_ref = vocab(ids), ref(ids)
    assert_close(out, out_ref)
    g = torch.randn_like(out_ref)
    (out_ref * g).sum().backward()
    (out * g).sum().backward()
    padded = torch.cat([ref.weight.grad, ref.weight.grad.new_zeros(64 * tp - 50, 6 * tp)])
    assert_close(vocab.weight.grad, _shard(padded, 0, rank, tp))
    assert vocab.state_dict()["weight"].shape == ref.weight.shape

    ref.zero_grad()
    emb = Embedding1D.from_native_module(copy.deepcopy(ref), None, gather_output=True)
    out = emb(ids)
    assert_close(out, out_ref.detach())
    (ref(ids) * g).sum().backward()
    (out * g).sum().backward()
    assert_close(emb.weight.grad, _shard(ref.weight.grad, 1, rank, tp))
    assert_close(emb.state_dict()["weight"], ref.weight.detach())


def check_gpt2_conv(rank: int) -> None:
    from transformers.pytorch_utils import Conv1D

    tp = comm.get_world().world_size
    torch.manual_seed(400 + tp)
    h = 2 * tp
    qkv, proj = Conv1D(3 * h, h), Conv1D(h, h)  # [in, out] weights, as GPT-2's
    x_ref = torch.randn(2, 5, h, requires_grad=True)
    col = GPT2FusedLinearConv1D_Col.from_native_module(
        copy.deepcopy(qkv), None, split_sizes=[h, h, h], gather_output=True
    )
    x = x_ref.detach().clone().requires_grad_()
    out, out_ref = col(x), qkv(x_ref)
    assert_close(out, out_ref)
    (out_ref**2).sum().backward()
    (out**2).sum().backward()
    assert_close(x.grad, x_ref.grad)
    want = torch.cat([_shard(part, 1, rank, tp) for part in qkv.weight.grad.split(h, dim=1)], dim=1)
    assert_close(col.weight.grad, want)
    assert_close(col.state_dict()["weight"], qkv.weight.detach())

    row = GPT2FusedLinearConv1D_Row.from_native_module(
        copy.deepcopy(proj), None, parallel_input=False
    )
    z_ref = torch.randn(3, h, requires_grad=True)
    z = z_ref.detach().clone().requires_grad_()
    assert_close(row(z), proj(z_ref))
    (proj(z_ref).sin()).sum().backward()
    (row(z).sin()).sum().backward()
    assert_close(z.grad, z_ref.grad)
    assert_close(row.weight.grad, _shard(proj.weight.grad, 0, rank, tp))


def check_norms_and_dropout(rank: int) -> None:
    tp = comm.get_world().world_size
    ln = nn.LayerNorm(8)
    assert LayerNorm.from_native_module(ln) is ln and FusedLayerNorm.from_native_module(ln) is ln
    rms = nn.RMSNorm(8)
    assert FusedRMSNorm.from_native_module(rms, sp_partial_derived=True) is rms
    assert rms.weight.partial_derived
    with pytest.raises(NotImplementedError, match="from_native_module"):
        LayerNorm()

    torch.manual_seed(7)  # the same base seed on every rank
    x = torch.ones(64, 32)
    same = DropoutForReplicatedInput.from_native_module(nn.Dropout(0.5), None)
    differ = DropoutForParallelInput.from_native_module(nn.Dropout(0.5), None)
    masks = torch.stack([same(x) != 0, differ(x) != 0]).to(torch.uint8)
    gathered = torch.empty(tp, *masks.shape, dtype=masks.dtype)
    comm.all_gather(gathered, masks)
    assert all(torch.equal(gathered[0][0], m[0]) for m in gathered)
    assert not torch.equal(gathered[0][1], gathered[1][1])
    assert 0.3 < masks[1].float().mean() < 0.7  # it drops about p of the elements
    assert not torch.equal(same(x), same(x))  # its stream advances between calls
    same.eval()
    assert torch.equal(same(x), x)


def check_torch_subgroup(rank: int) -> None:
    """A torch.distributed group of ranks 0 and 1 (e.g. a plugin's tp_group)."""
    group = dist.new_group([0, 1])
    if rank > 1:
        return
    torch.manual_seed(9)
    ref = nn.Linear(6, 4)
    col = Linear1D_Col.from_native_module(copy.deepcopy(ref), group, gather_output=True)
    x = torch.randn(3, 6)
    assert col.group.size == 2 and col.weight.shape == (2, 6)
    assert_close(col(x), ref(x))


def check_refusals(rank: int) -> None:
    tp = comm.get_world().world_size
    with pytest.raises(ValueError, match="fp8_communication"):
        Linear1D_Col.from_native_module(nn.Linear(6, 6), None, fp8_communication=True)
    with pytest.raises(ValueError, match="not a multiple"):
        Linear1D_Col.from_native_module(nn.Linear(6, 6 * tp + 1), None)
    small = nn.Linear(4, 1)  # fewer features than ranks: kept as it is, as ColossalAI
    assert Linear1D_Col.from_native_module(small, None) is small
    with pytest.raises(ImportError, match="HybridParallelPlugin"):
        from megalith.shardformer.layer import VocabParallelLMHead1D  # noqa: F401


@pytest.mark.timeout(90)
@pytest.mark.parametrize("tp", TP_SIZES)
def test_layers_match_torch(tp):
    run_distributed(_all_layers, tp, timeout=80)


def _all_layers(rank: int) -> None:
    check_linears(rank)
    check_sequence_parallel(rank)
    check_embeddings(rank)
    check_gpt2_conv(rank)
    check_norms_and_dropout(rank)
    check_refusals(rank)
    if comm.get_world().world_size == 3:
        check_torch_subgroup(rank)


class _Net(nn.Module):
    """The model zoo's simple_mlp (its hidden size 128 made 96, which 2 and 3 divide)."""

    def __init__(self, in_dim: int = 32, hid_dim: int = 96) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(in_dim, hid_dim), nn.Linear(hid_dim, in_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))


def simple_tp_mlp_trains(rank: int) -> list[float]:
    torch.manual_seed(11)
    ref = _Net()
    tp_net = _Net()
    tp_net.load_state_dict(ref.state_dict())
    tp_net.fc1 = Linear1D_Col.from_native_module(
        copy.deepcopy(ref.fc1),
        process_group=None,
        gather_output=False,
        overlap=True,
        dtype=torch.float32,
    )
    tp_net.fc2 = Linear1D_Row.from_native_module(
        copy.deepcopy(ref.fc2), process_group=None, parallel_input=True, dtype=torch.float32
    )
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2)
    opt = torch.optim.Adam(tp_net.parameters(), lr=1e-2)
    teacher = torch.randn(32, 32) / 6
    losses = []
    for _ in range(6):
        x = torch.randn(16, 32)
        y = x @ teacher
        loss_ref = nn.functional.mse_loss(ref(x), y)
        loss = nn.functional.mse_loss(tp_net(x), y)
        assert_close(loss, loss_ref)
        for o, lo in ((opt_ref, loss_ref), (opt, loss)):
            o.zero_grad()
            lo.backward()
            o.step()
        losses.append(loss.item())
    full = tp_net.state_dict()
    for name, value in ref.state_dict().items():
        assert_close(full[name], value, rtol=1e-5, atol=1e-5)
    return losses


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", TP_SIZES)
def test_simple_tp_mlp_trains_like_torch(tp):
    losses = run_distributed(simple_tp_mlp_trains, tp, timeout=50)
    assert losses[0] == losses[-1]
    assert losses[0][-1] < losses[0][0]  # it learned


def shardformer_gpt2(rank: int) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(5)
    cfg = GPT2Config(n_embd=24, n_layer=2, n_head=6, vocab_size=96, n_positions=32)
    ref = GPT2LMHeadModel(cfg).eval()
    model = copy.deepcopy(ref)
    config = ShardConfig(tensor_parallel_process_group=None, parallel_output=False)
    sharded, shared = ShardFormer(config).optimize(model)
    assert shared == [] and sharded.transformer.h[0].mlp.c_fc.weight.shape[1] == 4 * 24 // 2
    ids = torch.randint(0, 96, (2, 10))
    assert_close(sharded(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="HybridParallelPlugin"):
        ShardFormer(ShardConfig(pipeline_stage_manager=object())).optimize(copy.deepcopy(ref))


@pytest.mark.timeout(60)
def test_shardformer_optimize_gpt2():
    run_distributed(shardformer_gpt2, 2, timeout=50)
