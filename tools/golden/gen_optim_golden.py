#!/usr/bin/python3
"""Golden values for dtrain's optimizers (tests/optim/optimizers_golden_test.cc).

Regenerate from the repository root with Debian's python3-torch (the pyenv python3 first on
PATH has no torch):

    /usr/bin/python3 tools/golden/gen_optim_golden.py

It writes tests/golden/optim_golden.json. For each optimizer configuration it records the
initial values of two small variables (a 3x4 kernel and a 4-bias), five gradients per variable
and the variable values after each step. The updates follow Keras >= 2.11 (the "new"
optimizers), written here with float32 torch tensor ops and float64 Python scalars for the
per-step coefficients, as dtrain computes them. Where torch.optim implements the same math the
script asserts that it agrees, so the golden values are checked by an independent
implementation:
  * SGD (plain, momentum, nesterov) with a constant learning rate: identical math
    (torch's buf = -m/lr); checked to 1e-6.
  * RMSprop: Keras adds epsilon under the square root (g / sqrt(v + eps)), torch outside
    (g / (sqrt(v) + eps)). With eps = 0 the two are the same math (checked to 1e-6); with the
    default eps they differ by O(eps / sqrt(v)) (checked to 1e-5).
  * Adam / AdamW: Keras's "epsilon hat" form divides by (sqrt(v) + eps) after folding both bias
    corrections into the step size, torch divides by (sqrt(v) / sqrt(1 - b2^t) + eps), i.e.
    Keras's eps equals torch's eps * sqrt(1 - b2^t). With eps = 0 they agree to float rounding
    (checked to 1e-6); with eps = 1e-7 to ~1e-5 (checked). torch's amsgrad keeps
    max(vhat, v) like Keras and is checked the same way.
  * Gradient clipping (Keras's clipnorm, global_clipnorm, clipvalue, applied to the gradients
    before weight decay and the update): cross-checked with torch.nn.utils.clip_grad_norm_ (per
    variable for clipnorm, over all gradients for global_clipnorm) and clip_grad_value_ before
    torch.optim's step. torch divides by (norm + 1e-6) where Keras divides by max(norm, clip), a
    relative difference of ~1e-6 on clipped steps (checked to 1e-5).
  * AdamW's exclude_from_weight_decay (Keras 3: variables whose name matches are not decayed):
    torch.optim.AdamW with a parameter group of weight_decay 0 for the excluded variables.
  * CosineDecay (Keras 3, with warmup): Keras's formula written out in schedule_fn below.
"""
import json
import math
import os
import sys

import torch

VAR_NAMES = ["dense/kernel", "dense/bias"]
KERNEL_SHAPE = [3, 4]
BIAS_SHAPE = [4]
NUM_STEPS = 5
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                   "optim_golden.json")


def make_data():
    g = torch.Generator().manual_seed(20240611)
    kernel = torch.randn(KERNEL_SHAPE, generator=g, dtype=torch.float32) * 0.5
    bias = torch.randn(BIAS_SHAPE, generator=g, dtype=torch.float32) * 0.1
    grads = []
    for step in range(NUM_STEPS):
        # Varying scale so that m, v and the momentum really matter.
        scale = [1.0, 0.3, 2.0, 0.05, 1.2][step]
        gk = torch.randn(KERNEL_SHAPE, generator=g, dtype=torch.float32) * scale
        gb = torch.randn(BIAS_SHAPE, generator=g, dtype=torch.float32) * scale
        grads.append([gk, gb])
    return [kernel, bias], grads


# ---- learning-rate schedules (keras.optimizers.schedules) -------------------------------------

def schedule_fn(schedule):
    if schedule is None:
        return None
    cls, cfg = schedule["class_name"], schedule["config"]
    if cls == "ExponentialDecay":
        def f(step):
            p = step / cfg["decay_steps"]
            if cfg["staircase"]:
                p = math.floor(p)
            return cfg["initial_learning_rate"] * cfg["decay_rate"] ** p
        return f
    if cls == "PiecewiseConstantDecay":
        def f(step):
            for b, v in zip(cfg["boundaries"], cfg["values"]):
                if step <= b:
                    return v
            return cfg["values"][-1]
        return f
    if cls == "CosineDecay":
        # keras/src/optimizers/schedules/learning_rate_schedule.py, CosineDecay.__call__.
        def decayed(step, decay_from):
            completed = step / cfg["decay_steps"]
            cosine = 0.5 * (1.0 + math.cos(math.pi * completed))
            return decay_from * ((1 - cfg["alpha"]) * cosine + cfg["alpha"])

        def f(step):
            decay_steps = cfg["decay_steps"]
            if cfg.get("warmup_target") is None:
                return decayed(min(step, decay_steps), cfg["initial_learning_rate"])
            warmup_steps = cfg["warmup_steps"]
            step = min(step, decay_steps + warmup_steps)
            if step < warmup_steps:
                delta = cfg["warmup_target"] - cfg["initial_learning_rate"]
                return delta * (step / warmup_steps) + cfg["initial_learning_rate"]
            return decayed(step - warmup_steps, cfg["warmup_target"])
        return f
    raise ValueError(cls)


def keras_clip(cfg, gs):
    """Keras's BaseOptimizer._clip_gradients (float32 tensors, norms in float64 as dtrain)."""
    if cfg.get("clipnorm"):
        c = cfg["clipnorm"]
        out = []
        for g in gs:
            norm = math.sqrt((g.double() ** 2).sum().item())
            out.append(g * f32(c / max(norm, c)))
        return out
    if cfg.get("global_clipnorm"):
        c = cfg["global_clipnorm"]
        norm = math.sqrt(sum((g.double() ** 2).sum().item() for g in gs))
        scale = f32(c * min(1.0 / norm, 1.0 / c))
        return [g * scale for g in gs]
    if cfg.get("clipvalue"):
        c = f32(cfg["clipvalue"])
        return [torch.clamp(g, -c, c) for g in gs]
    return gs


# ---- Keras's update rules ------------------------------------------------------------------

def f32(x):
    """A Python scalar rounded to float32, as dtrain passes it to its kernels."""
    return float(torch.tensor(x, dtype=torch.float32))


def keras_run(class_name, cfg, schedule, init, grads, exclude=()):
    lr_fn = schedule_fn(schedule) or (lambda step: cfg["learning_rate"])
    vars_ = [v.clone() for v in init]
    slots = [dict() for _ in vars_]
    history = []
    for step, gs in enumerate(grads):
        lr = f32(lr_fn(step))  # Keras: the schedule at iterations before this update
        gs = keras_clip(cfg, gs)
        for i, (var, g) in enumerate(zip(vars_, gs)):
            s = slots[i]
            wd = cfg.get("weight_decay", 0.0)
            if any(e in VAR_NAMES[i] for e in exclude):
                wd = 0.0
            if class_name == "SGD":
                if wd:
                    var -= var * f32(wd * lr)
                mom = f32(cfg["momentum"])
                if cfg["momentum"] > 0:
                    m = s.setdefault("m", torch.zeros_like(var))
                    m.copy_(-g * lr + m * mom)
                    if cfg["nesterov"]:
                        var += -g * lr + m * mom
                    else:
                        var += m
                else:
                    var += -g * lr
            elif class_name in ("Adam", "AdamW"):
                b1, b2, eps = cfg["beta_1"], cfg["beta_2"], cfg["epsilon"]
                t = step + 1
                alpha = f32(lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t))
                if wd:
                    var -= var * f32(wd * lr)
                m = s.setdefault("m", torch.zeros_like(var))
                v = s.setdefault("v", torch.zeros_like(var))
                # Keras multiplies by the Python float 1 - beta (rounded to float32 once).
                m += (g - m) * f32(1 - b1)
                v += (g * g - v) * f32(1 - b2)
                vv = v
                if cfg["amsgrad"]:
                    vhat = s.setdefault("vhat", torch.zeros_like(var))
                    torch.maximum(vhat, v, out=vhat)
                    vv = vhat
                var -= (m * alpha) / (torch.sqrt(vv) + f32(eps))
            elif class_name == "RMSprop":
                rho, mom, eps = f32(cfg["rho"]), f32(cfg["momentum"]), f32(cfg["epsilon"])
                one_minus_rho = f32(1 - cfg["rho"])
                if wd:
                    var -= var * f32(wd * lr)
                v = s.setdefault("velocity", torch.zeros_like(var))
                v.copy_(rho * v + one_minus_rho * (g * g))
                if cfg["centered"]:
                    a = s.setdefault("average_gradient", torch.zeros_like(var))
                    a.copy_(rho * a + one_minus_rho * g)
                    denominator = v - a * a + eps
                else:
                    denominator = v + eps
                increment = g * lr / torch.sqrt(denominator)
                if cfg["momentum"] > 0:
                    mm = s.setdefault("momentum", torch.zeros_like(var))
                    mm.copy_(mom * mm + increment)
                    var -= mm
                else:
                    var -= increment
            else:
                raise ValueError(class_name)
        history.append([v.clone() for v in vars_])
    return history


# ---- torch.optim cross-checks --------------------------------------------------------------

def torch_clip(cfg, params):
    if cfg.get("clipnorm"):
        for p in params:
            torch.nn.utils.clip_grad_norm_([p], cfg["clipnorm"])
    elif cfg.get("global_clipnorm"):
        torch.nn.utils.clip_grad_norm_(params, cfg["global_clipnorm"])
    elif cfg.get("clipvalue"):
        torch.nn.utils.clip_grad_value_(params, cfg["clipvalue"])


def torch_run(make_opt, init, grads, make_scheduler=None, clip_cfg=None):
    params = [torch.nn.Parameter(v.clone()) for v in init]
    opt = make_opt(params)
    scheduler = make_scheduler(opt) if make_scheduler else None
    history = []
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = g.clone()
        if clip_cfg:
            torch_clip(clip_cfg, params)
        opt.step()
        if scheduler:
            scheduler.step()
        history.append([p.detach().clone() for p in params])
    return history


def torch_scheduler(schedule):
    """The torch.optim.lr_scheduler equal to a Keras schedule, for the schedules used below.
    torch starts at the optimizer's lr, so the caller passes the schedule's value at step 0."""
    cls, cfg = schedule["class_name"], schedule["config"]
    if cls == "ExponentialDecay" and not cfg["staircase"]:
        gamma = cfg["decay_rate"] ** (1.0 / cfg["decay_steps"])
        return lambda opt: torch.optim.lr_scheduler.ExponentialLR(opt, gamma=gamma)
    if cls == "PiecewiseConstantDecay":
        # Keras: values[i+1] once step > boundaries[i], i.e. from step boundaries[i] + 1 on;
        # torch's MultiStepLR multiplies by gamma at each milestone. Our values are a
        # geometric sequence, so MultiStepLR reproduces them.
        values = cfg["values"]
        gamma = values[1] / values[0]
        assert all(abs(values[i + 1] / values[i] - gamma) < 1e-12 for i in range(len(values) - 1))
        milestones = [b + 1 for b in cfg["boundaries"]]
        return lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, milestones, gamma=gamma)
    return None


def max_rel_diff(a, b):
    """Largest |a - b| over every step and tensor, relative to the largest |b| of that tensor
    (element-wise relative differences blow up where a value passes near zero, while the
    implementations differ by float rounding, ~1e-7 of the tensor's scale)."""
    worst = 0.0
    for sa, sb in zip(a, b):
        for ta, tb in zip(sa, sb):
            d = (ta.double() - tb.double()).abs().max().item() / tb.double().abs().max().item()
            worst = max(worst, d)
    return worst


def cross_check(label, keras_hist, torch_hist, tol):
    d = max_rel_diff(keras_hist, torch_hist)
    print(f"  cross-check {label}: max relative difference {d:.2e} (tolerance {tol:.0e})")
    if d > tol:
        sys.exit(f"torch.optim disagrees with the Keras formulas for {label}: {d} > {tol}")


def torch_cross_checks(case, init, grads, hist):
    cls, cfg = case["class_name"], case["config"]
    exclude = case.get("exclude_from_weight_decay", [])
    clip_tol = 1e-5 if any(cfg.get(k) for k in ("clipnorm", "global_clipnorm")) else 1e-6
    if case["schedule"] is not None and case["schedule"]["class_name"] == "CosineDecay":
        return  # Keras's formula, written out in schedule_fn
    if case["schedule"] is not None:
        # Schedules: Adam with eps = 0 (the same math in both, see above) and torch's scheduler.
        make_scheduler = torch_scheduler(case["schedule"])
        if cls != "Adam" or make_scheduler is None:
            return
        lr0 = schedule_fn(case["schedule"])(0)
        cfg0 = dict(cfg, epsilon=0.0)
        cross_check(case["name"] + " (eps=0)",
                    keras_run(cls, cfg0, case["schedule"], init, grads),
                    torch_run(lambda p: torch.optim.Adam(p, lr=lr0, betas=(cfg["beta_1"],
                                                                           cfg["beta_2"]), eps=0.0),
                              init, grads, make_scheduler), 1e-6)
        return
    if cls == "SGD":
        cross_check(case["name"], hist, torch_run(lambda p: torch.optim.SGD(
            p, lr=cfg["learning_rate"], momentum=cfg["momentum"], nesterov=cfg["nesterov"]),
            init, grads, clip_cfg=cfg), clip_tol)
    elif cls in ("Adam", "AdamW"):
        def make(eps):
            def mk(p):
                kw = dict(lr=cfg["learning_rate"], betas=(cfg["beta_1"], cfg["beta_2"]), eps=eps,
                          amsgrad=cfg["amsgrad"])
                if cls == "AdamW":
                    decayed = [q for i, q in enumerate(p)
                               if not any(e in VAR_NAMES[i] for e in exclude)]
                    kept = [q for i, q in enumerate(p) if any(e in VAR_NAMES[i] for e in exclude)]
                    groups = [{"params": decayed}] + ([{"params": kept, "weight_decay": 0.0}]
                                                      if kept else [])
                    return torch.optim.AdamW(groups, weight_decay=cfg["weight_decay"], **kw)
                return torch.optim.Adam(p, **kw)
            return mk
        cfg0 = dict(cfg, epsilon=0.0)
        cross_check(case["name"] + " (eps=0)", keras_run(cls, cfg0, None, init, grads, exclude),
                    torch_run(make(0.0), init, grads, clip_cfg=cfg), clip_tol)
        # Keras's epsilon hat differs from torch's eps by O(eps/sqrt(v)) (see above); clipped
        # gradients are smaller, so v is and the difference grows a little.
        cross_check(case["name"], hist,
                    torch_run(make(cfg["epsilon"]), init, grads, clip_cfg=cfg),
                    1e-5 if clip_tol < 1e-5 else 3e-5)
    elif cls == "RMSprop":
        def make(eps):
            return lambda p: torch.optim.RMSprop(p, lr=cfg["learning_rate"], alpha=cfg["rho"],
                                                 eps=eps, momentum=cfg["momentum"],
                                                 centered=cfg["centered"])
        cfg0 = dict(cfg, epsilon=0.0)
        cross_check(case["name"] + " (eps=0)", keras_run(cls, cfg0, None, init, grads),
                    torch_run(make(0.0), init, grads), 1e-6)
        cross_check(case["name"], hist, torch_run(make(cfg["epsilon"]), init, grads), 1e-5)


# ---- cases ---------------------------------------------------------------------------------

def sgd(lr, momentum=0.0, nesterov=False):
    return dict(learning_rate=lr, momentum=momentum, nesterov=nesterov, weight_decay=0.0)


def adam(lr, amsgrad=False, weight_decay=0.0):
    return dict(learning_rate=lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7, amsgrad=amsgrad,
                weight_decay=weight_decay)


def rmsprop(lr, momentum=0.0, centered=False):
    return dict(learning_rate=lr, rho=0.9, momentum=momentum, epsilon=1e-7, centered=centered,
                weight_decay=0.0)


CASES = [
    ("sgd_plain", "SGD", sgd(0.1), None),
    ("sgd_momentum", "SGD", sgd(0.1, momentum=0.9), None),
    ("sgd_nesterov", "SGD", sgd(0.1, momentum=0.9, nesterov=True), None),
    ("adam_default", "Adam", adam(0.05), None),
    ("adam_amsgrad", "Adam", adam(0.05, amsgrad=True), None),
    ("adamw", "AdamW", adam(0.05, weight_decay=0.1), None),
    ("rmsprop_plain", "RMSprop", rmsprop(0.01), None),
    ("rmsprop_momentum", "RMSprop", rmsprop(0.01, momentum=0.9), None),
    ("rmsprop_centered", "RMSprop", rmsprop(0.01, momentum=0.5, centered=True), None),
    ("adam_exponential_decay", "Adam", adam(0.0),
     {"class_name": "ExponentialDecay",
      "config": {"initial_learning_rate": 0.05, "decay_steps": 2, "decay_rate": 0.5,
                 "staircase": False}}),
    ("sgd_exponential_decay_staircase", "SGD", sgd(0.0, momentum=0.5),
     {"class_name": "ExponentialDecay",
      "config": {"initial_learning_rate": 0.2, "decay_steps": 2, "decay_rate": 0.3,
                 "staircase": True}}),
    ("adam_piecewise_constant_decay", "Adam", adam(0.0),
     {"class_name": "PiecewiseConstantDecay",
      "config": {"boundaries": [1, 3], "values": [0.05, 0.01, 0.002]}}),
    # Gradient clipping: the gradients' norms are ~3.5·scale (kernel) and ~2·scale (bias), with
    # scales 1, 0.3, 2, 0.05, 1.2, so some steps clip and some do not.
    ("sgd_momentum_clipnorm", "SGD", dict(sgd(0.1, momentum=0.9), clipnorm=1.5), None),
    ("sgd_momentum_global_clipnorm", "SGD", dict(sgd(0.1, momentum=0.9), global_clipnorm=2.0),
     None),
    ("sgd_clipvalue", "SGD", dict(sgd(0.1), clipvalue=0.5), None),
    ("adam_clipnorm", "Adam", dict(adam(0.05), clipnorm=1.5), None),
    ("adamw_global_clipnorm_exclude_bias", "AdamW",
     dict(adam(0.05, weight_decay=0.1), global_clipnorm=2.0), None, ["bias"]),
    ("adamw_exclude_bias", "AdamW", adam(0.05, weight_decay=0.1), None, ["bias"]),
    ("adam_cosine_decay", "Adam", adam(0.0),
     {"class_name": "CosineDecay",
      "config": {"initial_learning_rate": 0.05, "decay_steps": 3, "alpha": 0.1}}),
    ("adam_cosine_decay_warmup", "Adam", adam(0.0),
     {"class_name": "CosineDecay",
      "config": {"initial_learning_rate": 0.0, "decay_steps": 2, "alpha": 0.0,
                 "warmup_target": 0.05, "warmup_steps": 2}}),
]


def main():
    torch.set_num_threads(1)
    init, grads = make_data()
    cases = []
    for name, cls, cfg, schedule, *rest in CASES:
        print(name)
        case = {"name": name, "class_name": cls, "config": cfg, "schedule": schedule}
        exclude = rest[0] if rest else []
        if exclude:
            case["exclude_from_weight_decay"] = exclude
        if schedule is not None:
            case["config"] = {k: v for k, v in cfg.items() if k != "learning_rate"}
        hist = keras_run(cls, cfg, schedule, init, grads, exclude)
        torch_cross_checks(case, init, grads, hist)
        case["expected"] = [[v.flatten().tolist() for v in step] for step in hist]
        cases.append(case)
    doc = {
        "generator": "tools/golden/gen_optim_golden.py",
        "torch_version": torch.__version__,
        "variables": [
            {"name": "dense/kernel", "shape": KERNEL_SHAPE, "initial": init[0].flatten().tolist()},
            {"name": "dense/bias", "shape": BIAS_SHAPE, "initial": init[1].flatten().tolist()},
        ],
        "gradients": [[g.flatten().tolist() for g in step] for step in grads],
        "cases": cases,
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)}: {len(cases)} cases x {NUM_STEPS} steps")


if __name__ == "__main__":
    main()
