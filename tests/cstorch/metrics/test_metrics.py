"""cstorch.metrics against independent numpy references, eagerly and inside compiled eval
steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch import metrics as M
from cstorch.utils.data import DataExecutor, DataLoader
from tests.jit_cache import xla_compilations

# ------------------------------------------------------------------------ numpy references


def np_confusion(labels, preds, n, weights=None):
    cm = np.zeros((n, n))
    w = np.ones(labels.size) if weights is None else weights.ravel()
    np.add.at(cm, (labels.ravel(), preds.ravel()), w)
    return cm


def np_accuracy(labels, preds, weights=None):
    correct = (labels == preds).astype(float)
    if weights is None:
        return correct.sum() / correct.size
    return (correct * weights).sum() / (weights > 0).sum()


def np_mean_over_valid(num, den):
    valid = den != 0
    return (num[valid] / den[valid]).mean() if valid.any() else 0.0


def np_dice(labels, preds, n, weights=None, ignore=()):
    cm = np_confusion(labels, preds, n, weights)
    keep = np.array([c not in ignore for c in range(n)], float)
    tp = np.diag(cm) * keep
    return np_mean_over_valid(2 * tp, (cm.sum(0) + cm.sum(1)) * keep)


def np_mean_iou(labels, preds, n, weights=None, ignore=()):
    cm = np_confusion(labels, preds, n, weights)
    keep = np.array([c not in ignore for c in range(n)], float)
    tp = np.diag(cm) * keep
    return np_mean_over_valid(tp, (cm.sum(0) + cm.sum(1) - np.diag(cm)) * keep)


def _safe_div(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return np.where(b == 0, 0.0, a / np.where(b == 0, 1.0, b))


def np_fbeta(labels, preds, n, beta, average, ignore=()):
    cm = np_confusion(labels, preds, n)
    keep = np.array([c not in ignore for c in range(n)], float)
    tp, predicted, actual = np.diag(cm), cm.sum(0), cm.sum(1)
    b2 = beta**2

    def f(p, r):
        return _safe_div((1 + b2) * p * r, b2 * p + r)

    if average == "micro":
        return float(
            f(
                _safe_div((tp * keep).sum(), (predicted * keep).sum()),
                _safe_div((tp * keep).sum(), (actual * keep).sum()),
            )
        )
    per_class = f(_safe_div(tp, predicted), _safe_div(tp, actual))
    return float((per_class * keep).sum() / keep.sum())


def np_mpca(labels, preds, n, weights=None):
    w = np.ones(labels.size) if weights is None else weights.ravel()
    correct, tokens = np.zeros(n), np.zeros(n)
    np.add.at(correct, labels.ravel(), (labels.ravel() == preds.ravel()) * w)
    np.add.at(tokens, labels.ravel(), w)
    return float(_safe_div(correct, tokens).mean())


def np_at_k(labels, scores, k, weights=None, kind="precision"):
    top = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
    hits = np.array(
        [np.isin(row_labels, row_top).sum() for row_labels, row_top in zip(labels, top)], float
    )
    misses = (k - hits) if kind == "precision" else (labels.shape[-1] - hits)
    w = np.ones(len(labels)) if weights is None else np.broadcast_to(weights, hits.shape)
    return float((hits * w).sum() / ((hits + misses) * w).sum())


def np_roc_auc_exact(labels, scores, weights=None):
    """The area under the exact ROC curve (pairwise ranking, ties counting one half)."""
    w = np.ones(labels.size) if weights is None else weights
    pos, neg = labels > 0, labels <= 0
    diff = scores[pos][:, None] - scores[neg][None, :]
    pair_w = w[pos][:, None] * w[neg][None, :]
    return float((((diff > 0) + 0.5 * (diff == 0)) * pair_w).sum() / pair_w.sum())


def np_auc_riemann(labels, scores, num_thresholds, curve, method, weights=None):
    """AUC as a Riemann sum over evenly spaced thresholds (TF's definition)."""
    eps = 1e-7
    thresholds = np.array(
        [-eps] + [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)] + [1 + eps]
    )
    w = np.ones(labels.size) if weights is None else weights
    pos = labels > 0
    above = scores[None, :] > thresholds[:, None]
    tp = (above & pos) @ w
    fp = (above & ~pos) @ w
    fn = (~above & pos) @ w
    tn = (~above & ~pos) @ w
    if curve == "PR" and method == "interpolation":
        # Davis & Goadrich: interpolate TP and TP+FP linearly between thresholds.
        p = tp + fp
        d_tp, d_p = tp[:-1] - tp[1:], p[:-1] - p[1:]
        slope = _safe_div(d_tp, np.maximum(d_p, 0))
        intercept = tp[1:] - slope * p[1:]
        ratio = np.where((p[:-1] > 0) & (p[1:] > 0), _safe_div(p[:-1], np.maximum(p[1:], 0)), 1)
        return float(
            _safe_div(
                slope * (d_tp + intercept * np.log(ratio)), np.maximum(tp[1:] + fn[1:], 0)
            ).sum()
        )
    recall = _safe_div(tp, tp + fn)
    x, y = (_safe_div(fp, fp + tn), recall) if curve == "ROC" else (recall, _safe_div(tp, tp + fp))
    heights = {
        "interpolation": (y[:-1] + y[1:]) / 2,
        "minoring": np.minimum(y[:-1], y[1:]),
        "majoring": np.maximum(y[:-1], y[1:]),
    }[method]
    return float(((x[:-1] - x[1:]) * heights).sum())


# ------------------------------------------------------------------------ data
N_CLASSES = 4


def _batches(seed, n=3, size=24):
    g = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        out.append(
            dict(
                labels=g.integers(0, N_CLASSES, size),
                preds=g.integers(0, N_CLASSES, size),
                weights=(g.random(size) * (g.random(size) > 0.25)).astype(np.float32),
                binary=g.integers(0, 2, size),
                probs=g.random(size).astype(np.float32),
                multilabels=g.integers(0, 6, (size, 2)),
                scores=g.normal(size=(size, 6)).astype(np.float32),
                values=g.normal(size=size).astype(np.float32),
                loss=np.float32(g.random() * size),
            )
        )
    return out


def _cat(batches, key):
    return np.concatenate([b[key] for b in batches])


t = torch.as_tensor

# (label, factory, update(metric, batch), numpy reference over all batches, tolerance)
CASES = [
    (
        "accuracy",
        lambda: M.AccuracyMetric("acc"),
        lambda m, b: m(t(b["labels"]), t(b["preds"])),
        lambda bs: np_accuracy(_cat(bs, "labels"), _cat(bs, "preds")),
        1e-6,
    ),
    (
        "accuracy_weighted",
        lambda: M.AccuracyMetric("acc_w"),
        lambda m, b: m(t(b["labels"]), t(b["preds"]), weights=t(b["weights"])),
        lambda bs: np_accuracy(_cat(bs, "labels"), _cat(bs, "preds"), _cat(bs, "weights")),
        1e-5,
    ),
    (
        "mean",
        lambda: M.MeanMetric("mean"),
        lambda m, b: m(t(b["values"]), t(b["weights"])),
        lambda bs: (_cat(bs, "values") * _cat(bs, "weights")).sum() / _cat(bs, "weights").sum(),
        1e-5,
    ),
    (
        "perplexity",
        lambda: M.PerplexityMetric("ppl"),
        lambda m, b: m(t(b["labels"]), torch.as_tensor(b["loss"]), weights=t(b["weights"])),
        lambda bs: np.exp(sum(b["loss"] for b in bs) / (_cat(bs, "weights") > 0).sum()),
        1e-5,
    ),
    (
        "dice",
        lambda: M.DiceCoefficientMetric(N_CLASSES, ignore_classes=[0]),
        lambda m, b: m(t(b["labels"]), t(b["preds"]), weights=t(b["weights"])),
        lambda bs: np_dice(
            _cat(bs, "labels"), _cat(bs, "preds"), N_CLASSES, _cat(bs, "weights"), ignore=(0,)
        ),
        1e-5,
    ),
    (
        "mean_iou",
        lambda: M.MeanIOUMetric(N_CLASSES),
        lambda m, b: m(t(b["labels"]), t(b["preds"]), weights=t(b["weights"])),
        lambda bs: np_mean_iou(
            _cat(bs, "labels"), _cat(bs, "preds"), N_CLASSES, _cat(bs, "weights")
        ),
        1e-5,
    ),
    (
        "fbeta_micro",
        lambda: M.FBetaScoreMetric(N_CLASSES, beta=2.0, ignore_labels=[1]),
        lambda m, b: m(t(b["labels"]), t(b["preds"])),
        lambda bs: np_fbeta(
            _cat(bs, "labels"), _cat(bs, "preds"), N_CLASSES, 2.0, "micro", ignore=(1,)
        ),
        1e-5,
    ),
    (
        "fbeta_macro",
        lambda: M.FBetaScoreMetric(N_CLASSES, beta=0.5, average_type="macro"),
        lambda m, b: m(t(b["labels"]), t(b["preds"])),
        lambda bs: np_fbeta(_cat(bs, "labels"), _cat(bs, "preds"), N_CLASSES, 0.5, "macro"),
        1e-5,
    ),
    (
        "mean_per_class_accuracy",
        lambda: M.MeanPerClassAccuracyMetric(N_CLASSES),
        lambda m, b: m(t(b["labels"]), t(b["preds"]), weights=t(b["weights"])),
        lambda bs: np_mpca(_cat(bs, "labels"), _cat(bs, "preds"), N_CLASSES, _cat(bs, "weights")),
        1e-5,
    ),
    (
        "precision_at_k",
        lambda: M.PrecisionAtKMetric(k=3),
        lambda m, b: m(t(b["multilabels"]), t(b["scores"]), weights=t(b["weights"])),
        lambda bs: np_at_k(_cat(bs, "multilabels"), _cat(bs, "scores"), 3, _cat(bs, "weights")),
        1e-5,
    ),
    (
        "recall_at_k",
        lambda: M.RecallAtKMetric(k=2),
        lambda m, b: m(t(b["multilabels"]), t(b["scores"])),
        lambda bs: np_at_k(_cat(bs, "multilabels"), _cat(bs, "scores"), 2, kind="recall"),
        1e-5,
    ),
    (
        "auc_roc",
        lambda: M.AUCMetric(num_thresholds=50),
        lambda m, b: m(t(b["binary"]), t(b["probs"]), weights=t(b["weights"])),
        lambda bs: np_auc_riemann(
            _cat(bs, "binary"), _cat(bs, "probs"), 50, "ROC", "interpolation", _cat(bs, "weights")
        ),
        1e-5,
    ),
    (
        "auc_pr_interpolation",
        lambda: M.AUCMetric(num_thresholds=30, curve="PR"),
        lambda m, b: m(t(b["binary"]), t(b["probs"])),
        lambda bs: np_auc_riemann(_cat(bs, "binary"), _cat(bs, "probs"), 30, "PR", "interpolation"),
        1e-5,
    ),
    (
        "auc_pr_majoring",
        lambda: M.AUCMetric(curve="PR", summation_method="majoring"),
        lambda m, b: m(t(b["binary"]), t(b["probs"])),
        lambda bs: np_auc_riemann(_cat(bs, "binary"), _cat(bs, "probs"), 200, "PR", "majoring"),
        1e-5,
    ),
    (
        "auc_roc_minoring",
        lambda: M.AUCMetric(num_thresholds=20, summation_method="minoring"),
        lambda m, b: m(t(b["binary"]), t(b["probs"])),
        lambda bs: np_auc_riemann(_cat(bs, "binary"), _cat(bs, "probs"), 20, "ROC", "minoring"),
        1e-5,
    ),
]
FLOAT_RESULT = {
    "precision_at_k",
    "recall_at_k",
    "auc_roc",
    "auc_pr_interpolation",
    "auc_pr_majoring",
    "auc_roc_minoring",
}


@pytest.mark.parametrize("label,factory,update,reference,tol", CASES, ids=[c[0] for c in CASES])
def test_metric_matches_numpy_reference_eagerly(label, factory, update, reference, tol):
    batches = _batches(seed=len(label))
    metric = factory()
    for batch in batches:
        value = update(metric, batch)
    expected = reference(batches)
    result = metric.compute()
    if label in FLOAT_RESULT:
        assert type(result) is float and type(value) is float
    else:
        assert isinstance(result, torch.Tensor) and result.dim() == 0
        assert result.dtype == torch.float32
    assert float(result) == pytest.approx(float(expected), rel=tol, abs=tol)
    assert metric.num_updates == len(batches)


def test_roc_auc_riemann_sum_approaches_the_exact_area():
    g = np.random.default_rng(7)
    labels = g.integers(0, 2, 400)
    scores = np.clip(labels * 0.3 + g.random(400) * 0.7, 0, 1).astype(np.float32)
    metric = M.AUCMetric(num_thresholds=1000)
    metric(t(labels), t(scores))
    assert metric.compute() == pytest.approx(np_roc_auc_exact(labels, scores), abs=2e-3)


@pytest.mark.slow
def test_metrics_accumulate_inside_a_compiled_eval_step(cpu_backend):
    """All metrics updated in one traced step over several executor steps give the numpy
    values of all batches; compute() in the loop body sees each step's totals."""
    batches = _batches(seed=11)
    model = torch.nn.Identity()
    compiled = cstorch.compile(model, cpu_backend)
    metrics = {label: factory() for label, factory, *_ in CASES}

    @cstorch.trace
    @torch.no_grad()
    def eval_step(batch):
        tensors = {k: compiled(v) for k, v in batch.items()}
        outputs = {}
        for label, _, update, _, _ in CASES:
            outputs[label] = update(metrics[label], tensors)
        return outputs

    def input_fn():
        return [{k: torch.as_tensor(v) for k, v in b.items()} for b in batches]

    running_accuracy = []
    for step, batch in enumerate(DataExecutor(DataLoader(input_fn), num_steps=len(batches))):
        outputs = eval_step(batch)
        running_accuracy.append((float(outputs["accuracy"]), float(metrics["accuracy"])))
        expected = np_accuracy(
            _cat(batches[: step + 1], "labels"), _cat(batches[: step + 1], "preds")
        )
        assert running_accuracy[-1] == pytest.approx((expected, expected), rel=1e-6)
    assert eval_step.trace_count == 1 and xla_compilations(eval_step) == 1
    for label, _, _, reference, tol in CASES:
        metric = metrics[label]
        assert float(metric.compute()) == pytest.approx(
            float(reference(batches)), rel=tol, abs=tol
        ), label
        assert metric.num_updates == len(batches), label
        if label in FLOAT_RESULT:
            assert type(metric.compute()) is float
    # Nothing traced survives in the metrics' Python attributes.
    from torch._subclasses.fake_tensor import FakeTensor

    for metric in metrics.values():
        for value in vars(metric).values():
            leaves = torch.utils._pytree.tree_leaves(value)
            assert not any(isinstance(leaf, FakeTensor) for leaf in leaves)


# ------------------------------------------------------------------------ base behaviour
def test_name_is_required_and_state_is_not_persistent():
    with pytest.raises(TypeError):
        M.AccuracyMetric()
    m = M.AccuracyMetric("acc")
    assert m.state_dict() == {}
    m.register_state("extra", torch.zeros(2), persistent=True)
    assert list(m.state_dict()) == ["extra"]


def test_call_returns_value_and_compute_is_cached_until_state_changes(monkeypatch):
    m = M.AccuracyMetric("acc")
    value = m(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 0, 4]))
    assert isinstance(value, torch.Tensor) and value.dim() == 0 and float(value) == 0.75
    calls = []
    original = M.AccuracyMetric.compute
    monkeypatch.setattr(M.AccuracyMetric, "compute", lambda self: calls.append(1) or original(self))
    m2 = M.AccuracyMetric("acc2")
    m2.update(torch.tensor([1]), torch.tensor([1]))
    first = m2.compute()
    assert m2.compute() is first and calls == [1]
    m2.update(torch.tensor([1]), torch.tensor([0]))
    assert float(m2.compute()) == 0.5 and calls == [1, 1]
    assert float(m2) == 0.5


def test_reset_clears_state_and_updates():
    m = M.AccuracyMetric("acc")
    m(torch.tensor([1, 1]), torch.tensor([1, 0]))
    assert m.num_updates == 1
    m.reset()
    assert m.num_updates == 0
    assert float(m.total_num_tokens) == 0 and float(m.total_correct_predictions) == 0
    m(torch.tensor([1]), torch.tensor([1]))
    assert float(m.compute()) == 1.0


def test_shape_mismatch_warns_for_accuracy_and_raises_for_others():
    with pytest.warns(UserWarning, match="Shapes mismatch"):
        assert float(M.AccuracyMetric("a")(torch.tensor([1, 2]), torch.tensor([[1], [0]]))) == 0.5
    for metric in (
        M.DiceCoefficientMetric(3),
        M.MeanIOUMetric(3),
        M.FBetaScoreMetric(3),
        M.MeanPerClassAccuracyMetric(3),
        M.AUCMetric(),
    ):
        with pytest.raises(ValueError, match="mismatched shapes"):
            metric.update(torch.tensor([1, 0]), torch.tensor([1, 0, 1]))


@pytest.mark.parametrize(
    "make",
    [
        lambda: M.FBetaScoreMetric(num_classes=1),
        lambda: M.FBetaScoreMetric(3, beta=0),
        lambda: M.FBetaScoreMetric(3, average_type="weighted"),
        lambda: M.AUCMetric(curve="XY"),
        lambda: M.AUCMetric(summation_method="trapezoid"),
        lambda: M.AUCMetric(num_thresholds=1),
    ],
)
def test_constructor_validation(make):
    with pytest.raises(ValueError):
        make()


def test_value_checks_of_eager_updates():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        M.AUCMetric().update(torch.tensor([0, 1]), torch.tensor([0.5, 1.5]))
    with pytest.raises(ValueError, match="Negative"):
        M.AUCMetric().update(torch.tensor([-1, 1]), torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="Negative"):
        M.DiceCoefficientMetric(3).update(torch.tensor([-1, 1]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="scalar or a vector"):
        M.PrecisionAtKMetric(1).update(
            torch.zeros(2, 1, dtype=torch.long), torch.rand(2, 3), weights=torch.ones(3)
        )


def test_precision_at_k_compute_is_a_python_float():
    m = M.PrecisionAtKMetric(k=2)
    m.update(torch.tensor([[0], [2]]), torch.tensor([[0.9, 0.1, 0.0], [0.0, 0.2, 0.8]]))
    assert type(m.compute()) is float and m.compute() == 0.5


def test_dtype_argument_casts_the_result():
    m = M.MeanMetric("m")
    assert m(torch.tensor([1.0, 2.0]), dtype=torch.float16).dtype == torch.float16


def test_get_all_metrics_suffixes_shared_names_and_star_import_works():
    M.Metric.registry.clear()
    a, b, c = M.AccuracyMetric("acc"), M.AccuracyMetric("acc"), M.MeanMetric("loss")
    assert list(M.get_all_metrics()) == [("acc.0", a), ("acc.1", b), ("loss", c)]
    namespace = {}
    exec("from cerebras.pytorch.metrics import *", namespace)
    assert "compute_all_metrics" not in namespace and "AccuracyMetric" in namespace


def test_metric_created_before_the_backend_attaches_on_eager_use_or_explains(tmp_path):
    early = M.AccuracyMetric("early")
    backend = cstorch.backend("CPU", artifact_dir=str(tmp_path))
    compiled = cstorch.compile(torch.nn.Identity(), backend)

    @cstorch.trace
    def step(x):
        early(compiled(x), x)
        return x.sum()

    with pytest.raises(RuntimeError, match="created before the backend"):
        step(torch.ones(2))
    early.update(torch.ones(2), torch.ones(2))  # eager use attaches it
    list(DataExecutor(DataLoader(lambda: [torch.ones(2)]), num_steps=1))
    step2 = cstorch.trace(step.step_fn)
    for x in DataExecutor(DataLoader(lambda: [torch.ones(2)]), num_steps=2):
        step2(x)
    assert early.num_updates == 3 and float(early.compute()) == 1.0
