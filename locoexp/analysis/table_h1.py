"""Table H1's scaling study predicted from XLA-TPU's compiled decode iterations: each model's
step at each rollout TP on 128 TPU v7x chips, and so its fastest TP (issue 41, Section 4.1).

The study's setup (Sections 3.1-3.2, App. H): 256 prompts x 8 = 2,048 completions a step, each
forced to 8,192 tokens, prompts of about 150 tokens; the sampler holds 1,024 sequences at a time
over DP = 256 / TP replicas (m = 1,024 / DP rows each), so two decode waves; 405B holds 16 rows
per replica at TP16 and 32 at TP32, so 8 waves. Per cell, with the figures of the model's
decode iteration compiled by XLA-TPU at that TP (experiments/compiled/decode_iterations.jsonl):

- decode: waves x 8,192 iterations of Eq. 2, d_iter(t) = kappa + (Q_w / t + Q_KV) / beta_eff +
  C_TP(t), Q_w / t the compiled weight bytes per device (k/v projections replicated above 8
  KV heads, as compiled), Q_KV the m rows' cache at the wave's mean length (150 + 4,096 tokens)
  times the compiled bytes per cached token per device, and C_TP(t) = the compiled program's
  collectives x ALPHA_COLLECTIVE_MS x (t - 1): the per-collective cost fitted at TP2 (App. C,
  0.6B's 0.68 ms) grown with the t - 1 steps of a collective over t devices (a stated form,
  no constant of its own);
- training: TRAIN_PASSES forwards a trained token (step.py) from the compiled FLOPs (a token's
  forward plus attention over its context, XLA's FLOPs per cached token), over the 256 cores
  at constants.MFU (fitted on Qwen3-0.6B: it overstates the large models' training, which is
  the same at every TP and so moves no verdict); publication: the weights over ICI.
Host orchestration (Table H1's host share: 0.9-40% of the step) is not modelled for the
Pathways stack: it is one controller's work, about constant across a model's TPs, so it moves
no verdict; the step shown is the device programs' and the paper's non-host seconds stand
beside it. No per-model or per-cell factor. Never imports jax.
"""

from locoexp.analysis.constants import ALPHA_COLLECTIVE_MS, MFU
from locoexp.analysis.predict import DecodeFigures, decode_figures, predict_iteration
from locoexp.analysis.step import TRAIN_PASSES, compute_s, publish_s, row_flops
from locoexp.errors import ConfigError

COMPLETIONS, FORCED, PROMPT, IN_FLIGHT, CORES = 2048, 8192, 150, 1024, 256  # Sections 3.1, H
# Table H1 (s): model -> {TP: (step, host share %)}; FASTEST: Table 2's fastest TP and its ties
TABLE_H1 = {
    "qwen3_0_6b": {1: (68.6, 36.4), 2: (71.4, 28.7), 4: (74.9, 22.6), 8: (100.4, 18.6),
                   16: (174.1, 8.3)},
    "qwen3_1_7b": {1: (79.6, 29.8), 2: (80.1, 26.5), 4: (87.3, 21.8), 8: (103.6, 15.0),
                   16: (182.6, 10.2)},
    "qwen3_4b": {1: (123.6, 21.9), 2: (108.5, 17.6), 4: (118.5, 17.7), 8: (135.3, 12.0),
                 16: (236.3, 8.8)},
    "qwen3_8b": {1: (167.2, 18.3), 2: (137.3, 16.6), 4: (134.1, 18.3), 8: (151.2, 15.3),
                 16: (247.2, 9.4)},
    "qwen3_14b": {2: (190.0, 13.7), 4: (168.9, 14.8), 8: (178.6, 13.2)},
    "qwen3_32b": {2: (350.6, 7.9), 4: (301.3, 8.3), 8: (303.8, 6.3), 16: (468.4, 5.2)},
    "llama3_1_70b": {4: (457.3, 7.2), 8: (425.6, 7.0), 16: (605.2, 5.0)},
    "synthetic_100b": {16: (382.9, 5.5)},
    "synthetic_200b": {16: (729.3, 4.4), 32: (965.9, 3.0)},
    "llama3_1_405b": {16: (3334.3, 1.4), 32: (4102.7, 0.9)},
}  # fmt: skip
FASTEST = {"qwen3_0_6b": (1, 2), "qwen3_1_7b": (1, 2), "qwen3_4b": (2,), "qwen3_8b": (4, 2),
           "qwen3_14b": (4,), "qwen3_32b": (4, 8), "llama3_1_70b": (8,),
           "synthetic_100b": (16,), "synthetic_200b": (16,), "llama3_1_405b": (16,)}  # fmt: skip
DTYPE = "bfloat16"


def rows_and_waves(model: str, tp: int) -> tuple[int, int]:
    """(m rows per replica, decode waves) of a cell: App. H's 1,024 in flight over 256 / TP
    replicas; 405B's m of 16 (TP16) or 32 (TP32), 8 waves."""
    m = {16: 16, 32: 32}[tp] if model == "llama3_1_405b" else IN_FLIGHT * tp // CORES
    return m, COMPLETIONS // (m * CORES // tp)


def predict_cell(figures: DecodeFigures, model: str, hop_ms: float) -> dict:
    """The device seconds of one Table H1 cell (see the module's notes), unrounded; `hop_ms`
    the cost of one of a collective's t - 1 steps."""
    t = figures.tp
    m, waves = rows_and_waves(model, t)
    cached = PROMPT + (FORCED - 1) / 2  # a row's mean cache over its 8,192 iterations
    eq2 = predict_iteration(figures, rows=m, cached_tokens=cached, hop_ms=hop_ms)
    d_iter, weight_ms, kv_ms, c_tp = eq2.total_ms, eq2.weight_ms, eq2.kv_ms, eq2.tp_ms
    train = compute_s(TRAIN_PASSES * COMPLETIONS * row_flops(figures, PROMPT + FORCED), CORES,
                      MFU.value)  # fmt: skip
    publish = publish_s(figures)
    decode = waves * FORCED * d_iter / 1e3
    return dict(model=model, tp=t, m=m, waves=waves, weight_ms=weight_ms, kv_ms=kv_ms,
                c_tp_ms=c_tp, d_iter_ms=d_iter, decode_s=decode, train_s=train,
                publish_s=publish, step_s=decode + train + publish)  # fmt: skip


def table_h1_rows(
    cache: list[DecodeFigures], hop_ms: float = ALPHA_COLLECTIVE_MS.value
) -> list[dict]:
    """Every cell of Table H1 with a compiled iteration: predicted beside the paper (its step
    and its seconds outside host orchestration); cells without one say the command. `hop_ms`:
    App. C's per-collective cost at TP2 unless given."""
    rows = []
    for model, cells in TABLE_H1.items():
        for tp, (paper, host) in cells.items():
            try:
                figures = decode_figures(cache, model=model, tp=tp, dtype=DTYPE)
            except ConfigError as missing:  # not compiled yet: the refusal names the command
                rows.append(dict(model=model, tp=tp, **{"not predicted": str(missing)}))
                continue
            got = {k: (round(v, 3) if isinstance(v, float) else v)
                   for k, v in predict_cell(figures, model, hop_ms).items()}  # fmt: skip
            rows.append(
                got | dict(paper_s=paper, paper_non_host_s=round(paper * (1 - host / 100), 1))
            )
    return rows


def fastest_tp(rows: list[dict], fitted: tuple[str, ...] = ()) -> list[dict]:
    """Per model: the predicted fastest TP beside Table 2's (ties: its '≈'); held out unless
    the model is in `fitted` (App. C's C_TP fits nothing on Table H1)."""
    out = []
    for model, paper in FASTEST.items():
        cells = [r for r in rows if r["model"] == model and "step_s" in r]
        if len(cells) < len(TABLE_H1[model]):
            out.append(dict(model=model, predicted="(not compiled)", paper=paper[0]))
            continue
        best = min(cells, key=lambda r: r["step_s"])["tp"]
        verdict = "right" if best == paper[0] else "tied in the paper" if best in paper else "wrong"
        out.append(dict(model=model, predicted=f"TP{best}", paper=f"TP{paper[0]}"
                        + "".join(f" ≈ TP{t}" for t in paper[1:]), verdict=verdict,
                        status="fit" if model in fitted else "held out"))  # fmt: skip
    return out
