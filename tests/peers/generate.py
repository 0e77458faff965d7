#!/usr/bin/env python3
"""Peer reference vectors: runs the peers' own loss / advantage / KL /
aggregation functions on seeded random inputs and writes what they return
(loss, metrics, d loss / d logprobs by torch autograd) as JSON under
tests/peers/vectors/<peer>/<function>.json. Nothing of the peers is copied
into this tree: the functions are imported from a checkout of the peer at the
pinned commit below. peer_vectors_test (tests/peers/peer_vectors_test.cpp)
maps every vector onto our plugins and compares.

    python tests/peers/generate.py --verl PATH --areal PATH --areal-legacy PATH \
        --prime-rl PATH --xorl PATH \
        --surogate PATH [--out DIR]

PATH is a checkout (a git work tree, or a tree extracted with `git archive`)
of the peer at the pinned commit; a git work tree at another commit is
refused. The peers need torch (any 2.x, CPU) and their import-time packages;
tests/peers/make_peer_venv.sh builds such a venv. The outputs are float64 and
deterministic (fixed seeds, CPU).
"""

import argparse
import json
import os
import subprocess
import sys
import types

PINS = {
    "verl": ("https://github.com/volcengine/verl", "b178a3cd56f58b2d502255daba591e92833930a7"),
    "areal": ("https://github.com/inclusionAI/AReaL", "4aef98d8d818af55b43621aaadba047ae10f4e77"),
    "prime-rl": ("https://github.com/PrimeIntellect-ai/prime-rl",
                 "559b44772e471d1538537b8805cc77f3824a5e64"),
    # the last commit with behave_imp_weight_cap / behave_imp_weight_mode (the
    # next one, bc9f009, replaced them by rejection_sampling)
    "areal_legacy": ("https://github.com/inclusionAI/AReaL",
                     "d37095aea00942f392a00072df9a4a4e0e4ff9f7"),
    "xorl": ("https://github.com/togethercomputer/xorl", "4d8c620b26ae03ed83f395ecff75cd048f5fc35c"),
    "surogate": ("https://github.com/invergent-ai/surogate",
                 "524fb776007222cfc306b5f067e8430643cf2339"),
}

torch = None  # imported in main(), after the peer paths are set


def check_checkout(peer, path):
    """Refuses a git work tree at another commit than the pin."""
    commit = PINS[peer][1]
    if not os.path.isdir(path):
        sys.exit(f"{peer}: checkout '{path}' is not a directory")
    try:
        head = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        print(f"{peer}: {path} is not a git work tree; taking it as {commit} (extracted)")
        return
    if head != commit:
        sys.exit(f"{peer}: checkout {path} is at {head}, the vectors pin {commit} "
                 f"(git -C {path} checkout {commit}, or change PINS and regenerate)")


def tolist(x):
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.bool:
            x = x.to(torch.int64)
        return x.tolist()
    return x


def num(x):
    return float(x.detach().item()) if isinstance(x, torch.Tensor) else float(x)


class Writer:
    def __init__(self, out_dir, peer):
        self.out_dir = os.path.join(out_dir, peer)
        self.peer = peer
        os.makedirs(self.out_dir, exist_ok=True)

    def write(self, function, layout, cases, note=""):
        repo, commit = PINS[self.peer]
        doc = {
            "peer": self.peer,
            "repo": repo,
            "commit": commit,
            "function": function,
            "layout": layout,
            "note": note,
            "generator": "tests/peers/generate.py",
            "cases": cases,
        }
        path = os.path.join(self.out_dir, function + ".json")
        with open(path, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
        print(f"wrote {path}: {len(cases)} cases")


# ---- inputs ---------------------------------------------------------------------------

RATIO_ANCHORS = [0.05, 0.15, 0.5, 0.9, 1.0, 1.1, 1.5, 2.5, 4.0, 9.0]


def uni(g, shape, a, b):
    return a + (b - a) * torch.rand(shape, generator=g, dtype=torch.float64)


def anchor_log_ratios(g, shape):
    idx = torch.randint(0, len(RATIO_ANCHORS), shape, generator=g)
    base = torch.tensor(RATIO_ANCHORS, dtype=torch.float64)[idx]
    return torch.log(base) + uni(g, shape, -0.01, 0.01)


def padded_mask(g, B, L, empty_rows=(), holes=0.0):
    """verl's response_mask: each row a prefix of ones (its response), padding
    after; some rows fully masked; optionally holes inside the response."""
    mask = torch.zeros(B, L, dtype=torch.float64)
    for i in range(B):
        n = int(torch.randint(1, L + 1, (1,), generator=g))
        mask[i, :n] = 1.0
        if i in empty_rows:
            mask[i] = 0.0
    if holes > 0:
        drop = torch.rand(B, L, generator=g) < holes
        mask[drop] = 0.0
    return mask


def signed(g, shape, lo=0.2, hi=2.0):
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return sign * uni(g, shape, lo, hi)


def policy_inputs(seed, B, L, empty_rows=(), holes=0.0, seq_adv=False, log_ratio=None):
    g = torch.Generator().manual_seed(seed)
    mask = padded_mask(g, B, L, empty_rows, holes)
    lp = uni(g, (B, L), -3.0, -0.05)
    lr = anchor_log_ratios(g, (B, L)) if log_ratio is None else log_ratio(g, (B, L))
    old = lp - lr
    adv = signed(g, (B, 1)).expand(B, L).clone() if seq_adv else signed(g, (B, L))
    ref = lp + uni(g, (B, L), -1.0, 1.0)
    w = uni(g, (B, L), 0.2, 2.0)
    return g, dict(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask,
                   ref_log_prob=ref, rollout_is_weights=w)


# ---- verl -----------------------------------------------------------------------------


def verl_import(path):
    # verl/__init__.py imports the whole framework (ray, DataProto); the
    # functions under test need only their own modules: a namespace stand-in
    # for the top package lets them import without running it.
    pkg = types.ModuleType("verl")
    pkg.__path__ = [os.path.join(path, "verl")]
    sys.modules["verl"] = pkg
    import verl.trainer.ppo.core_algos as core_algos
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig
    return core_algos, ActorConfig, PolicyLossConfig


def verl_vectors(path, w):
    ca, ActorConfig, PolicyLossConfig = verl_import(path)

    def actor_config(**kw):
        pl = kw.pop("policy_loss", {})
        return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                           policy_loss=PolicyLossConfig(**pl), **kw)

    def run_policy(mode, inp, params, cfg, use_is=False, agg="token-mean"):
        lp = inp["log_prob"].clone().requires_grad_(True)
        fn = ca.get_policy_loss_fn(mode)
        loss, metrics = fn(old_log_prob=inp["old_log_prob"], log_prob=lp,
                           advantages=inp["advantages"], response_mask=inp["response_mask"],
                           loss_agg_mode=agg, config=cfg,
                           rollout_is_weights=inp["rollout_is_weights"] if use_is else None)
        loss.backward()
        names = ["old_log_prob", "log_prob", "advantages", "response_mask"]
        if use_is:
            names.append("rollout_is_weights")
        return {
            "parameters": dict(params, loss_mode=mode, loss_agg_mode=agg),
            "inputs": {k: tolist(inp[k]) for k in names},
            "outputs": {"loss": num(loss), "grad_log_prob": tolist(lp.grad),
                        "metrics": {k.split("/")[-1]: float(v) for k, v in metrics.items()}},
        }

    def clipped_case(name, mode, inp, low, high, use_is, agg="token-mean"):
        """run_policy of `mode` with the clip bounds low / high, as the case `name`."""
        bounds = dict(clip_ratio_low=low, clip_ratio_high=high)
        case = run_policy(mode, inp, bounds, actor_config(**bounds), use_is=use_is, agg=agg)
        case["name"] = name
        return case

    layout = "padded: [batch, response_length] rows, response_mask 1 on loss tokens"

    # vanilla PPO with dual clip (always on in verl, clip_ratio_c), clip-higher,
    # rollout correction weights
    cases = []
    for i, (B, L, low, high, c, empty, holes, use_is) in enumerate([
            (5, 7, 0.2, 0.2, 3.0, (), 0.0, False),
            (6, 9, 0.2, 0.28, 3.0, (2,), 0.15, False),
            (4, 5, 0.1, 0.3, 2.0, (0,), 0.0, True),
            (7, 11, 0.2, 0.28, 10.0, (3, 5), 0.1, False)]):
        _, inp = policy_inputs(100 + i, B, L, empty, holes)
        cfg = actor_config(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c)
        case = run_policy("vanilla", inp, dict(clip_ratio_low=low, clip_ratio_high=high,
                                               clip_ratio_c=c), cfg, use_is=use_is)
        case["name"] = f"vanilla_{i}"
        cases.append(case)
    w.write("compute_policy_loss_vanilla", layout, cases)

    # rollout correction (verl/trainer/ppo/rollout_corr_helper.py) feeding the
    # vanilla loss: token TIS weights, and token rejection masks, which verl
    # applies by removing the rejected tokens from response_mask
    import verl.trainer.ppo.rollout_corr_helper as rc
    cases = []
    for i, (kind, spec) in enumerate([("is_token", 2.0), ("is_token", 1.3),
                                      ("rs_token_k1", "0.6_1.8"), ("rs_token_k2", 0.08),
                                      ("rs_token_k1", 1.5)]):
        g, inp = policy_inputs(150 + i, 6, 8, (2,) if i % 2 else (), 0.1)
        rollout = inp["old_log_prob"] - uni(g, (6, 8), -0.8, 0.8)
        log_ratio = inp["old_log_prob"] - rollout
        mask = inp["response_mask"]
        if kind == "is_token":
            weights, _ = rc.compute_rollout_correction_weights(log_ratio, mask, rollout_is="token",
                                                               rollout_is_threshold=spec)
            params = {"rollout_is": "token", "rollout_is_threshold": spec}
            used_mask = mask
        else:
            weights = None
            keep, _ = rc.compute_rollout_rejection_mask(log_ratio, mask,
                                                        rollout_rs=kind.replace("rs_", ""),
                                                        rollout_rs_threshold=spec)
            params = {"rollout_rs": kind.replace("rs_", ""), "rollout_rs_threshold": spec}
            used_mask = mask * keep
        cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
        lp = inp["log_prob"].clone().requires_grad_(True)
        loss, metrics = ca.get_policy_loss_fn("vanilla")(
            old_log_prob=inp["old_log_prob"], log_prob=lp, advantages=inp["advantages"],
            response_mask=used_mask, loss_agg_mode="token-mean", config=cfg,
            rollout_is_weights=weights)
        loss.backward()
        cases.append({
            "name": f"rollout_corr_{i}_{kind}",
            "parameters": dict(params, loss_mode="vanilla", clip_ratio_low=0.2,
                               clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-mean"),
            "inputs": {"old_log_prob": tolist(inp["old_log_prob"]), "log_prob": tolist(inp["log_prob"]),
                       "rollout_log_prob": tolist(rollout), "advantages": tolist(inp["advantages"]),
                       "response_mask": tolist(mask)},
            "outputs": {"loss": num(loss), "grad_log_prob": tolist(lp.grad),
                        "response_mask_after": tolist(used_mask),
                        "metrics": {k.split("/")[-1]: float(v) for k, v in metrics.items()}},
        })
    w.write("rollout_correction", layout, cases,
            "log_ratio = old_log_prob - rollout_log_prob; compute_rollout_correction_weights "
            "(rollout_is) or compute_rollout_rejection_mask (rollout_rs, applied to "
            "response_mask), then compute_policy_loss_vanilla")

    # aggregation modes (agg_loss) over the unclipped surrogate -A * exp(lp - old)
    cases = []
    for i, (B, L, empty, holes) in enumerate([(5, 6, (), 0.0), (6, 9, (1,), 0.2)]):
        for mode in ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                     "seq-mean-token-sum-norm"]:
            _, inp = policy_inputs(200 + i, B, L, empty, holes)
            lp = inp["log_prob"].clone().requires_grad_(True)
            loss_mat = -inp["advantages"] * torch.exp(lp - inp["old_log_prob"])
            loss = ca.agg_loss(loss_mat=loss_mat, loss_mask=inp["response_mask"],
                               loss_agg_mode=mode)
            loss.backward()
            cases.append({
                "name": f"agg_{i}_{mode}",
                "parameters": {"loss_agg_mode": mode,
                               "loss_mat": "-advantages * exp(log_prob - old_log_prob)"},
                "inputs": {k: tolist(inp[k]) for k in
                           ["old_log_prob", "log_prob", "advantages", "response_mask"]},
                "outputs": {"loss": num(loss), "grad_log_prob": tolist(lp.grad), "metrics": {}},
            })
    w.write("agg_loss", layout, cases,
            "loss_mat = -advantages * exp(log_prob - old_log_prob), aggregated by agg_loss")

    # GSPO: sequence-constant advantages (verl's GSPO-token form equals the
    # plain derivative only then; docs/losses.md "gspo")
    def seq_log_ratio(g, shape):
        B, L = shape
        return torch.log(torch.tensor([0.6, 0.85, 0.97, 1.02, 1.1, 1.4, 2.0],
                                      dtype=torch.float64))[torch.randint(0, 7, (B, 1), generator=g)] \
            + uni(g, shape, -0.3, 0.3)

    cases = []
    for i, (B, L, low, high, empty, holes, use_is, seq_adv) in enumerate([
            (6, 8, 0.2, 0.28, (), 0.0, False, True), (7, 10, 0.1, 0.15, (2,), 0.15, False, True),
            (5, 6, 3e-4, 4e-4, (), 0.0, False, True), (6, 8, 0.2, 0.28, (4,), 0.1, True, True),
            (6, 9, 0.2, 0.28, (1,), 0.1, False, False)]):
        _, inp = policy_inputs(300 + i, B, L, empty, holes, seq_adv=seq_adv,
                               log_ratio=seq_log_ratio)
        cases.append(clipped_case(f"gspo_{i}", "gspo", inp, low, high, use_is,
                                  agg="seq-mean-token-mean"))
    w.write("compute_policy_loss_gspo", layout, cases)

    # GMPO (geo_mean): log-space clip; sequence-constant advantages (verl's
    # comment: only sequence-level advantages are supported)
    cases = []
    for i, (B, L, low, high, empty, holes, use_is) in enumerate([
            (6, 8, 0.4, 0.4, (), 0.0, False), (7, 9, 0.2, 0.3, (1, 4), 0.1, False),
            (5, 7, 0.4, 0.4, (), 0.0, True)]):
        _, inp = policy_inputs(400 + i, B, L, empty, holes, seq_adv=True,
                               log_ratio=lambda g, s: uni(g, s, -1.0, 1.0))
        if use_is:  # one weight per sequence: verl takes their geometric mean
            inp["rollout_is_weights"] = inp["rollout_is_weights"][:, :1].expand(B, L).clone()
        cases.append(clipped_case(f"geo_mean_{i}", "geo_mean", inp, low, high, use_is))
    w.write("compute_policy_loss_geo_mean", layout, cases)

    # SAPO
    cases = []
    for i, (B, L, tp, tn, empty, holes, use_is) in enumerate([
            (6, 8, 1.0, 1.05, (), 0.0, False), (5, 9, 2.0, 3.0, (2,), 0.15, True)]):
        _, inp = policy_inputs(500 + i, B, L, empty, holes,
                               log_ratio=lambda g, s: uni(g, s, -1.5, 1.5))
        cfg = actor_config(tau_pos=tp, tau_neg=tn)
        case = run_policy("sapo", inp, dict(tau_pos=tp, tau_neg=tn), cfg, use_is=use_is,
                          agg="seq-mean-token-mean")
        case["name"] = f"sapo_{i}"
        cases.append(case)
    w.write("compute_policy_loss_sapo", layout, cases)

    # Clip-Cov: clip_cov_ratio 1, so every candidate is dropped
    cases = []
    for i, (B, L, low, high, lb, ub, empty, holes) in enumerate([
            (6, 8, 0.2, 0.2, 0.3, 2.0, (), 0.0), (7, 9, 0.2, 0.28, 0.1, 1.0, (3,), 0.1)]):
        _, inp = policy_inputs(600 + i, B, L, empty, holes)
        pl = dict(clip_cov_ratio=1.0, clip_cov_lb=lb, clip_cov_ub=ub)
        cfg = actor_config(clip_ratio_low=low, clip_ratio_high=high, policy_loss=pl)
        case = run_policy("clip_cov", inp, dict(pl, clip_ratio_low=low, clip_ratio_high=high), cfg)
        case["name"] = f"clip_cov_{i}"
        cases.append(case)
    # clip_cov_ratio < 1 with more candidates than k: verl drops a random k of
    # them (torch.randperm; the draw is seeded here, and no other
    # implementation reproduces it). Two more runs of verl's own function on
    # the same inputs fix what the draw is taken from: at clip_cov_ratio 1
    # every candidate is dropped, and with clip_cov_lb = clip_cov_ub none is.
    # A token is a candidate when the first zeroes its gradient and the second
    # does not (candidates are unclipped, so their gradient is non-zero there).
    for i, (B, L, low, high, ratio, lb, ub, empty, holes) in enumerate([
            (6, 9, 0.2, 0.2, 0.1, 0.0, 5.0, (), 0.0),
            (7, 10, 0.2, 0.28, 0.25, -0.5, 1.5, (2,), 0.1),
            (8, 11, 0.2, 0.28, 0.03, 0.0, 5.0, (5,), 0.15)]):
        _, inp = policy_inputs(650 + i, B, L, empty, holes)
        runs = {}
        for kind, pl in [("drawn", dict(clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=ub)),
                         ("all", dict(clip_cov_ratio=1.0, clip_cov_lb=lb, clip_cov_ub=ub)),
                         ("none", dict(clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=lb))]:
            torch.manual_seed(6500 + i)
            cfg = actor_config(clip_ratio_low=low, clip_ratio_high=high, policy_loss=pl)
            runs[kind] = run_policy("clip_cov", inp, dict(pl, clip_ratio_low=low,
                                                          clip_ratio_high=high), cfg)
        case = runs["drawn"]
        grad = {k: torch.tensor(v["outputs"]["grad_log_prob"]) for k, v in runs.items()}
        live = (grad["none"] != 0) & (inp["response_mask"] > 0)
        case["name"] = f"clip_cov_random_{i}"
        case["outputs"].update({
            "candidates": tolist(live & (grad["all"] == 0)),
            "dropped": tolist(live & (grad["drawn"] == 0)),
            "loss_none_dropped": runs["none"]["outputs"]["loss"],
            "grad_log_prob_none_dropped": runs["none"]["outputs"]["grad_log_prob"],
            "pg_clipfrac_all_dropped": runs["all"]["outputs"]["metrics"]["pg_clipfrac"],
        })
        cases.append(case)
    w.write("compute_policy_loss_clip_cov", layout, cases,
            "clip_cov_random_*: clip_cov_ratio < 1, verl's draw seeded with torch.manual_seed; "
            "candidates / dropped from verl's gradients at clip_cov_ratio 1 and with "
            "clip_cov_lb = clip_cov_ub (no candidate), on the same inputs")

    # KL-Cov
    cases = []
    for i, (B, L, ratio, coef, empty, holes) in enumerate([
            (6, 8, 0.2, 1.0, (), 0.0), (7, 9, 0.05, 0.1, (2,), 0.1), (4, 5, 1e-4, 0.5, (), 0.0)]):
        _, inp = policy_inputs(700 + i, B, L, empty, holes)
        pl = dict(kl_cov_ratio=ratio, ppo_kl_coef=coef)
        cfg = actor_config(policy_loss=pl)
        case = run_policy("kl_cov", inp, pl, cfg)
        case["name"] = f"kl_cov_{i}"
        cases.append(case)
    w.write("compute_policy_loss_kl_cov", layout, cases)

    # CISPO and GPG
    cases = []
    for i, (B, L, low, high, empty, holes, use_is) in enumerate([
            (6, 8, 0.2, 0.28, (), 0.0, False), (5, 9, 0.5, 3.0, (1,), 0.15, True)]):
        _, inp = policy_inputs(800 + i, B, L, empty, holes)
        cases.append(clipped_case(f"cispo_{i}", "cispo", inp, low, high, use_is))
    w.write("compute_policy_loss_cispo", layout, cases)
    cases = []
    for i, (B, L, empty, holes, agg) in enumerate([(6, 8, (), 0.0, "token-mean"),
                                                   (5, 9, (2,), 0.1, "seq-mean-token-mean")]):
        _, inp = policy_inputs(900 + i, B, L, empty, holes)
        case = run_policy("gpg", inp, {}, actor_config(), agg=agg)
        case["name"] = f"gpg_{i}"
        cases.append(case)
    w.write("compute_policy_loss_gpg", layout, cases)

    # KL estimators, as the actor's KL loss uses them:
    # agg_loss(kl_penalty(log_prob, ref_log_prob, kl_loss_type), token-mean)
    cases, refused = [], []
    for i, kind in enumerate(["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3",
                              "k1+", "low_var_kl+", "k3+", "abs+"]):
        _, inp = policy_inputs(1000 + i, 5, 7, (1,) if i % 2 else (), 0.1 if i % 3 else 0.0)
        lp = inp["log_prob"].clone().requires_grad_(True)
        try:
            k = ca.kl_penalty(lp, inp["ref_log_prob"], kind)
        except NotImplementedError:
            # at b178a3c kl_penalty hands the '+' name itself to
            # kl_penalty_forward, which knows only the plain names
            refused.append(kind)
            continue
        loss = ca.agg_loss(loss_mat=k, loss_mask=inp["response_mask"], loss_agg_mode="token-mean")
        loss.backward()
        cases.append({
            "name": f"kl_penalty_{kind}",
            "parameters": {"kl_penalty": kind, "loss_agg_mode": "token-mean"},
            "inputs": {k2: tolist(inp[k2]) for k2 in ["log_prob", "ref_log_prob", "response_mask"]},
            "outputs": {"loss": num(loss), "grad_log_prob": tolist(lp.grad),
                        "metrics": {}, "kl": tolist(k)},
        })
    w.write("kl_penalty", layout, cases,
            "loss = agg_loss(kl_penalty(log_prob, ref_log_prob, kind), response_mask, token-mean)"
            + (f"; kl_penalty raised NotImplementedError for {', '.join(refused)}" if refused else ""))

    # the critic: compute_value_loss (0.5 * the larger squared error)
    cases = []
    for i, (B, L, clip, agg, empty) in enumerate([(5, 7, 0.5, "token-mean", ()),
                                                 (6, 8, 0.2, "seq-mean-token-mean", (2,)),
                                                 (4, 6, 0.1, "seq-mean-token-sum", ())]):
        g = torch.Generator().manual_seed(1050 + i)
        mask = padded_mask(g, B, L, empty, 0.1)
        old = uni(g, (B, L), -2.0, 2.0)
        # value moves of 0.25 to 3 clip widths either way
        vpreds = old + signed(g, (B, L), 0.25 * clip, 3.0 * clip)
        returns = uni(g, (B, L), -2.0, 2.0)
        v = vpreds.clone().requires_grad_(True)
        loss, clipfrac = ca.compute_value_loss(vpreds=v, returns=returns, values=old,
                                               response_mask=mask, cliprange_value=clip,
                                               loss_agg_mode=agg)
        loss.backward()
        cases.append({
            "name": f"value_loss_{i}",
            "parameters": {"cliprange_value": clip, "loss_agg_mode": agg},
            "inputs": {"vpreds": tolist(vpreds), "returns": tolist(returns), "values": tolist(old),
                       "response_mask": tolist(mask)},
            "outputs": {"loss": num(loss), "grad_vpreds": tolist(v.grad),
                        "metrics": {"vf_clipfrac": num(clipfrac)}},
        })
    w.write("compute_value_loss", layout, cases)

    verl_advantage_vectors(ca, w)


def verl_advantage_vectors(ca, w):
    from omegaconf import OmegaConf  # verl reads config.gamma and config.get(...)

    layout = "padded: [batch, response_length] rows, response_mask 1 on response tokens"

    def outcome_inputs(seed, B, L, groups, token_noise=False, ties=False):
        g = torch.Generator().manual_seed(seed)
        mask = padded_mask(g, B, L)
        last = mask.sum(-1).long() - 1
        if ties:
            scores = torch.randint(0, 3, (B,), generator=g).to(torch.float64)
        else:
            scores = uni(g, (B,), -1.0, 2.0)
        tlr = torch.zeros(B, L, dtype=torch.float64)
        tlr[torch.arange(B), last] = scores
        if token_noise:  # per-token rewards (e.g. a KL penalty) before the outcome
            tlr = tlr + uni(g, (B, L), -0.2, 0.2) * mask
        return g, tlr, mask, list(groups)

    def case(name, params, inputs, adv, ret):
        return {"name": name, "parameters": params,
                "inputs": {k: tolist(v) for k, v in inputs.items()},
                "outputs": {"advantages": tolist(adv), "returns": tolist(ret)}}

    groups_a = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3]  # group 3 is a singleton
    groups_b = [5, 7, 5, 7, 5, 7, 9, 9]        # non-contiguous, no singleton

    cases = []
    for i, (groups, norm, ties) in enumerate([(groups_a, True, False), (groups_b, False, False),
                                              (groups_b, True, True)]):
        _, tlr, mask, idx = outcome_inputs(1100 + i, len(groups), 6, groups, ties=ties)
        a, r = ca.compute_grpo_outcome_advantage(tlr, mask, idx, epsilon=1e-6,
                                                 norm_adv_by_std_in_grpo=norm)
        cases.append(case(f"grpo_{i}", {"epsilon": 1e-6, "norm_adv_by_std_in_grpo": norm},
                          {"token_level_rewards": tlr, "response_mask": mask, "index": idx}, a, r))
    w.write("compute_grpo_outcome_advantage", layout, cases)

    # the outcome estimators without parameters, each on both group layouts
    for name, seed in (("rloo", 1200), ("opo", 1300)):
        function = f"compute_{name}_outcome_advantage"
        cases = []
        for i, groups in enumerate([groups_a, groups_b]):
            _, tlr, mask, idx = outcome_inputs(seed + i, len(groups), 6, groups)
            a, r = getattr(ca, function)(tlr, mask, idx)
            cases.append(case(f"{name}_{i}", {}, {"token_level_rewards": tlr,
                                                  "response_mask": mask, "index": idx}, a, r))
        w.write(function, layout, cases)

    cases = []
    for i, (groups, f_norm, zeros) in enumerate([(groups_a, 1.0, False), (groups_b, 2.0, True)]):
        _, tlr, mask, idx = outcome_inputs(1400 + i, len(groups), 6, groups)
        if zeros:  # some zero rewards: verl's alpha counts the non-zero ones
            tlr[[0, 3]] = 0.0
        a, r = ca.compute_gpg_outcome_advantage(tlr, mask, idx, f_norm=f_norm)
        cases.append(case(f"gpg_{i}", {"f_norm": f_norm}, {"token_level_rewards": tlr,
                                                           "response_mask": mask, "index": idx},
                          a, r))
    w.write("compute_gpg_outcome_advantage", layout, cases)

    cases = []
    for i, norm in enumerate([True, False]):
        _, tlr, mask, idx = outcome_inputs(1500 + i, len(groups_b), 6, groups_b)
        a, r = ca.compute_grpo_passk_outcome_advantage(
            tlr, mask, idx, epsilon=1e-6, config=OmegaConf.create({"norm_adv_by_std_in_grpo": norm}))
        cases.append(case(f"grpo_passk_{i}", {"epsilon": 1e-6, "norm_adv_by_std_in_grpo": norm},
                          {"token_level_rewards": tlr, "response_mask": mask, "index": idx}, a, r))
    w.write("compute_grpo_passk_outcome_advantage", layout, cases)

    cases = []
    for i, gamma in enumerate([1.0, 0.9]):
        _, tlr, mask, idx = outcome_inputs(1600 + i, 7, 8, range(7), token_noise=(i == 1))
        a, r = ca.compute_reinforce_plus_plus_outcome_advantage(tlr, mask,
                                                                config=OmegaConf.create({"gamma": gamma}))
        cases.append(case(f"reinforce_pp_{i}", {"gamma": gamma},
                          {"token_level_rewards": tlr, "response_mask": mask}, a, r))
    w.write("compute_reinforce_plus_plus_outcome_advantage", layout, cases)

    cases = []
    for i, groups in enumerate([groups_b, [0, 0, 1, 1, 1, 2, 2]]):
        _, tlr, mask, idx = outcome_inputs(1700 + i, len(groups), 6, groups)
        a, r = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(tlr, mask, idx)
        cases.append(case(f"reinforce_pp_baseline_{i}", {},
                          {"token_level_rewards": tlr, "response_mask": mask, "index": idx}, a, r))
    w.write("compute_reinforce_plus_plus_baseline_outcome_advantage", layout, cases)

    cases = []
    for i in range(2):
        g, tlr, mask, _ = outcome_inputs(1800 + i, 6, 7, range(6), token_noise=(i == 1))
        base = uni(g, (6,), -0.5, 1.5)
        a, r = ca.compute_remax_outcome_advantage(tlr, base, mask)
        cases.append(case(f"remax_{i}", {}, {"token_level_rewards": tlr, "reward_baselines": base,
                                            "response_mask": mask}, a, r))
    w.write("compute_remax_outcome_advantage", layout, cases)

    cases = []
    for i, (gamma, lam) in enumerate([(1.0, 0.95), (0.99, 0.9), (0.9, 1.0)]):
        g, tlr, mask, _ = outcome_inputs(1900 + i, 6, 8, range(6), token_noise=(i == 1))
        values = uni(g, (6, 8), -1.0, 1.0)
        a, r = ca.compute_gae_advantage_return(tlr, values, mask, gamma, lam)
        cases.append(case(f"gae_{i}", {"gamma": gamma, "lam": lam},
                          {"token_level_rewards": tlr, "values": values, "response_mask": mask},
                          a, r))
    w.write("compute_gae_advantage_return", layout, cases)


# ---- AReaL ----------------------------------------------------------------------------


def areal_import(path):
    sys.path.insert(0, path)
    import areal.api.cli_args  # noqa: F401 (AReaL's own import order)
    import areal.utils.functional.functional as functional
    from areal.api.cli_args import RejectionSamplingConfig
    return functional, RejectionSamplingConfig


def packed_inputs(seed, lens, empty=(), holes=0.15, log_ratio_prox=None, behav_scale=1.2,
                  seq_adv=False):
    g = torch.Generator().manual_seed(seed)
    n = sum(lens)
    cu = [0]
    for l in lens:
        cu.append(cu[-1] + l)
    mask = torch.rand(n, generator=g) >= holes
    for s in empty:
        mask[cu[s]:cu[s + 1]] = False
    lp = uni(g, (n,), -3.0, -0.05)
    lr = anchor_log_ratios(g, (n,)) if log_ratio_prox is None else log_ratio_prox(g, (n,))
    prox = lp - lr
    old = prox - uni(g, (n,), -behav_scale, behav_scale)
    if seq_adv:
        adv = torch.cat([signed(g, (1,)).expand(l) for l in lens])
    else:
        adv = signed(g, (n,))
    return dict(logprobs=lp, proximal_logprobs=prox, old_logprobs=old, advantages=adv,
                loss_mask=mask, cu_seqlens=torch.tensor(cu, dtype=torch.int64))


def _stub_attr(module, attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return type(f"{module}.{attr}", (), {})


def areal_actor_stats(stat, loss_mask, rejection=True):
    """The metrics AReaL's actor logs from the stat dict of ppo_actor_loss_fn
    (areal/trainer/ppo/actor.py: stats_tracker, denominators n_valid_tokens =
    the call's loss_mask and unclipped_behave_tokens = behave_mask);
    rs_filtered_fraction only where the function has rejection sampling (not
    the legacy behaviour cap)."""
    n = loss_mask.sum().clamp(min=1).double()
    m = {
        "importance_weight": num(torch.where(loss_mask, stat["importance_weight"], 0).sum() / n),
        "approx_kl": num(torch.where(loss_mask, stat["approx_kl"], 0).sum() / n),
        "clip_ratio": num(stat["clip_mask"][loss_mask].sum() / n),
        "dual_clip_ratio": num(stat["dual_clip_mask"][loss_mask].sum() / n),
    }
    if "behave_mask" in stat:
        bm = stat["behave_mask"]
        nb = bm.sum().clamp(min=1).double()
        m["behave_imp_weight"] = num(torch.where(bm, stat["behave_imp_weight"], 0).sum() / nb)
        m["behave_approx_kl"] = num(torch.where(bm, stat["behave_approx_kl"], 0).sum() / nb)
        if rejection:
            m["rs_filtered_fraction"] = float(stat["filtered_fraction"])
    return m


def areal_vectors(path, w):
    F, RSConfig = areal_import(path)
    layout = "packed: 1-D tokens, cu_seqlens, loss_mask (bool)"

    def rs_dict(rs):
        return None if rs is None else {k: getattr(rs, k) for k in
                                        ["level", "action", "metric", "agg", "upper", "lower"]}

    specs = [
        # name, seed, lens, empty, eps, eps_higher, c_clip, rejection (dict), level
        ("token_plain", 1, [6, 1, 9, 4], (), 0.2, None, None, None, "token"),
        ("token_dual_clip_higher", 2, [7, 5, 8, 3, 6], (3,), 0.2, 0.28, 3.0, None, "token"),
        ("rs_token_mask_ratio", 3, [6, 9, 4, 7], (), 0.2, None, 3.0,
         dict(level="token", action="mask", metric="ratio", upper=2.0), "token"),
        ("rs_token_mask_ratio_lower", 4, [8, 5, 7], (1,), 0.2, 0.28, None,
         dict(level="token", action="mask", metric="ratio", upper=1.8, lower=0.6), "token"),
        ("rs_token_clamp_ratio", 5, [6, 9, 4, 7], (), 0.2, None, 3.0,
         dict(level="token", action="clamp", metric="ratio", upper=1.5, lower=0.7), "token"),
        ("rs_token_mask_kl_k3", 6, [6, 9, 4, 7], (), 0.2, None, None,
         dict(level="token", action="mask", metric="kl_k3", upper=0.2), "token"),
        ("rs_seq_mask_ratio_mean", 7, [6, 9, 4, 7, 5, 8], (2,), 0.2, None, None,
         dict(level="sequence", action="mask", metric="ratio", agg="mean", upper=1.3,
              lower=0.8), "token"),
        ("rs_seq_clamp_ratio_mean", 8, [6, 9, 4, 7, 5], (), 0.2, 0.28, 3.0,
         dict(level="sequence", action="clamp", metric="ratio", agg="mean", upper=1.1,
              lower=0.92), "token"),
        ("rs_seq_mask_ratio_sum", 9, [6, 9, 4, 7, 5], (), 0.2, None, None,
         dict(level="sequence", action="mask", metric="ratio", agg="sum", upper=1.5), "token"),
        ("rs_seq_mask_ratio_max", 10, [6, 9, 4, 7, 5], (), 0.2, None, None,
         dict(level="sequence", action="mask", metric="ratio", agg="max", upper=1.7), "token"),
        ("rs_seq_mask_kl_k1_sum", 11, [6, 9, 4, 7, 5], (), 0.2, None, None,
         dict(level="sequence", action="mask", metric="kl_k1", agg="sum", upper=0.5,
              lower=-0.5), "token"),
        ("rs_seq_mask_kl_k2_mean", 12, [6, 9, 4, 7, 5], (), 0.2, None, None,
         dict(level="sequence", action="mask", metric="kl_k2", agg="mean", upper=0.06), "token"),
        ("gspo_plain", 13, [6, 9, 4, 7, 5], (1,), 0.2, 0.28, None, None, "sequence"),
        ("gspo_dual_clip_rs_seq_mask", 14, [6, 9, 4, 7, 5, 8], (), 0.2, None, 3.0,
         dict(level="sequence", action="mask", metric="ratio", agg="mean", upper=1.1,
              lower=0.9), "sequence"),
        ("gspo_rs_token_mask", 15, [6, 9, 4, 7, 5, 8], (), 0.2, None, 3.0,
         dict(level="token", action="mask", metric="ratio", upper=1.6, lower=0.6), "sequence"),
        ("gspo_rs_seq_clamp", 16, [6, 9, 4, 7, 5], (), 0.2, 0.28, None,
         dict(level="sequence", action="clamp", metric="ratio", agg="mean", upper=1.1,
              lower=0.92), "sequence"),
    ]
    cases = []
    for name, seed, lens, empty, eps, eps_hi, c_clip, rs, level in specs:
        seq = level == "sequence"
        inp = packed_inputs(2000 + seed, lens, empty, seq_adv=False,
                            log_ratio_prox=(lambda g, s: uni(g, s, -0.5, 0.5)) if seq else None,
                            behav_scale=0.6 if rs and rs.get("level") == "sequence" else 1.2)
        rs_cfg = None if rs is None else RSConfig(**rs)
        lp = inp["logprobs"].clone().requires_grad_(True)
        loss, stat = F.ppo_actor_loss_fn(
            logprobs=lp, proximal_logprobs=inp["proximal_logprobs"],
            old_logprobs=inp["old_logprobs"], advantages=inp["advantages"], eps_clip=eps,
            loss_mask=inp["loss_mask"], eps_clip_higher=eps_hi, c_clip=c_clip,
            rejection_sampling=rs_cfg, importance_sampling_level=level,
            cu_seqlens=inp["cu_seqlens"])
        loss.backward()
        grad = lp.grad if lp.grad is not None else torch.zeros_like(lp)
        cases.append({
            "name": name,
            "parameters": {"eps_clip": eps, "eps_clip_higher": eps_hi, "c_clip": c_clip,
                           "rejection_sampling": rs_dict(rs_cfg),
                           "importance_sampling_level": level},
            "inputs": {k: tolist(v) for k, v in inp.items()},
            "outputs": {"loss": num(loss), "grad_logprobs": tolist(grad),
                        "metrics": areal_actor_stats(stat, inp["loss_mask"])},
        })
    w.write("ppo_actor_loss_fn", layout, cases,
            "metrics as areal/trainer/ppo/actor.py logs them from the returned stat dict")

    cases = []
    # token level; then sequence level (one gate of the geometric-mean ratio and
    # the mean advantage per sequence): an empty sequence, per-token and
    # per-sequence advantages, ratios around the gates' bend
    for i, (tp, tn, lens, level, seed, empty, seq_adv, spread) in enumerate([
            (1.0, 1.05, [6, 1, 9, 4], "token", 2100, (), False, 1.5),
            (2.0, 3.0, [7, 5, 8, 3, 6], "token", 2101, (1,), False, 1.5),
            (1.0, 1.05, [6, 1, 9, 4, 7], "sequence", 2110, (), False, 0.8),
            (2.0, 3.0, [7, 5, 8, 3, 6, 9], "sequence", 2111, (2,), False, 0.8),
            (0.5, 4.0, [5, 8, 6, 4, 7, 3], "sequence", 2112, (), True, 0.8)]):
        inp = packed_inputs(seed, lens, empty, seq_adv=seq_adv,
                            log_ratio_prox=lambda g, s, a=spread: uni(g, s, -a, a))
        lp = inp["logprobs"].clone().requires_grad_(True)
        loss, stat = F.sapo_loss_fn(logprobs=lp, old_logprobs=inp["proximal_logprobs"],
                                    advantages=inp["advantages"], tau_pos=tp, tau_neg=tn,
                                    loss_mask=inp["loss_mask"], importance_sampling_level=level,
                                    cu_seqlens=inp["cu_seqlens"])
        loss.backward()
        n = inp["loss_mask"].sum().double()
        cases.append({
            "name": f"sapo_{level}_{i if level == 'token' else i - 2}",
            "parameters": {"tau_pos": tp, "tau_neg": tn, "importance_sampling_level": level},
            "inputs": {"logprobs": tolist(inp["logprobs"]),
                       "old_logprobs": tolist(inp["proximal_logprobs"]),
                       "advantages": tolist(inp["advantages"]), "loss_mask": tolist(inp["loss_mask"]),
                       "cu_seqlens": tolist(inp["cu_seqlens"])},
            "outputs": {"loss": num(loss), "grad_logprobs": tolist(lp.grad), "metrics": {
                "importance_weight": num(stat["importance_weight"][inp["loss_mask"]].sum() / n),
                "sapo_soft_gate": num(stat["sapo_soft_gate"][inp["loss_mask"]].sum() / n)}},
        })
    w.write("sapo_loss_fn", layout, cases,
            "metrics as areal/trainer/ppo/actor.py logs them (denominator: loss tokens)")

    # the critic (float32 only: the function asserts it)
    cases = []
    for i, (kind, clip, lens) in enumerate([("mse", 0.2, [6, 1, 9, 4]), ("huber", 0.5, [7, 5, 8]),
                                            ("mse", 0.5, [5, 8, 3, 6])]):
        g = torch.Generator().manual_seed(2200 + i)
        n = sum(lens)
        mask = torch.rand(n, generator=g) >= 0.15
        old = uni(g, (n,), -2.0, 2.0).float()
        value = (old + signed(g, (n,), 0.25 * clip, 3.0 * clip)).float()
        # huber: errors on both sides of its fixed delta 10
        target = (uni(g, (n,), -20.0, 20.0) if kind == "huber" else uni(g, (n,), -2.0, 2.0)).float()
        v = value.clone().requires_grad_(True)
        loss, stat = F.ppo_critic_loss_fn(v, old, target, clip, loss_mask=mask, loss_fn_type=kind)
        loss.backward()
        cu = [0]
        for l in lens:
            cu.append(cu[-1] + l)
        cases.append({
            "name": f"critic_{kind}_{i}",
            "parameters": {"value_eps_clip": clip, "loss_fn_type": kind},
            "inputs": {"value": tolist(value.double()), "old_value": tolist(old.double()),
                       "target_value": tolist(target.double()), "loss_mask": tolist(mask),
                       "cu_seqlens": cu},
            "outputs": {"loss": num(loss), "grad_value": tolist(v.grad.double()), "metrics": {
                "clip_ratio": num(stat["clip_mask"].sum() / mask.sum())}},
        })
    w.write("ppo_critic_loss_fn", layout, cases,
            "float32 inputs (AReaL asserts it); clip_ratio as the actor logs it (loss tokens)")

    # advantage normalization (areal/utils/data.py Normalization, NormConfig)
    from areal.api.cli_args import NormConfig
    from areal.utils.data import Normalization

    def normalization_case(name, seed, B, cfg):
        g = torch.Generator().manual_seed(seed)
        L = 7
        mask = padded_mask(g, B, L, (), 0.1)
        x = uni(g, (B, L), -2.0, 3.0) * mask
        full = dict(dict(mean_level="batch", std_level="batch", mean_leave1out=False,
                         std_unbiased=True, eps=1e-5, group_size=1), **cfg)
        out = Normalization(NormConfig(**full))(x, mask)
        return {
            "name": name,
            "parameters": full,
            "inputs": {"x": tolist(x), "loss_mask": tolist(mask)},
            "outputs": {"normalized": tolist(out.double())},
        }

    cases = []
    for i, cfg in enumerate([
            dict(mean_level="batch", std_level="batch"),
            dict(mean_level="group", std_level="group", group_size=3),
            dict(mean_level="group", std_level="batch", group_size=2, std_unbiased=False),
            dict(mean_level="group", std_level=None, mean_leave1out=True, group_size=3),
            dict(mean_level="batch", std_level="group", mean_leave1out=True, group_size=2,
                 eps=1e-3),
            dict(mean_level=None, std_level="batch")]):
        cases.append(normalization_case(f"normalization_{i}", 2300 + i, 6, cfg))
    # batches that are not a multiple of group_size: AReaL's group loops run
    # over bs // group_size groups; the leftover rows belong to none
    for i, (B, cfg) in enumerate([
            (7, dict(mean_level="group", std_level="group", group_size=3)),
            (8, dict(mean_level="group", std_level=None, mean_leave1out=True, group_size=3)),
            (7, dict(mean_level=None, std_level="group", group_size=4, std_unbiased=False,
                     eps=1e-3))]):
        cases.append(normalization_case(f"normalization_leftover_{i}", 2350 + i, B, cfg))
    w.write("Normalization", "padded: [batch, seq] rows, groups of group_size consecutive rows",
            cases, "areal/utils/data.py Normalization(NormConfig(...))(x, loss_mask)")

    # the actor's advantage pipeline: PPOActor._compute_advantages (reward
    # bias / scaling / clip, KL-penalised token rewards, GAE with the
    # truncated-row bootstrap, adv_norm), on an actor built without an engine
    from types import SimpleNamespace
    # experiment trackers the actor module's imports reach; nothing here calls them
    for name in ["swanlab", "trackio"]:
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__getattr__ = lambda attr, name=name: _stub_attr(name, attr)
            sys.modules[name] = stub
    from areal.trainer.ppo.actor import PPOActor
    from areal.utils.data import KLEstimator
    cases = []
    for i, cfg in enumerate([
            dict(),
            dict(reward_bias=-0.5, reward_scaling=2.0, reward_clip=1.5, discount=0.9,
                 gae_lambda=0.8, kl_ctl=0.1, kl_estimator="k3"),
            dict(mask_no_eos_with_zero=True, kl_ctl=0.05, kl_estimator="k2", discount=0.95,
                 gae_lambda=0.9, adv_norm=dict(mean_level="group", std_level="group",
                                               group_size=2)),
            dict(kl_ctl=0.2, kl_estimator="k1", adv_norm=dict(mean_level="batch",
                                                              std_level="batch")),
            dict(discount=1.0, gae_lambda=1.0, values=False,
                 adv_norm=dict(mean_level="group", std_level=None, mean_leave1out=True,
                               group_size=3)),
            # reward_norm: AReaL's Normalization on the [batch] rewards (no mask)
            # after bias / scaling / clip, before the no-EOS zeroing
            dict(reward_bias=0.5, reward_scaling=1.5, reward_clip=3.0,
                 mask_no_eos_with_zero=True, kl_ctl=0.1, kl_estimator="k3", discount=0.9,
                 gae_lambda=0.8, reward_norm=dict(mean_level="group", std_level="group",
                                                  group_size=3)),
            dict(kl_ctl=0.05, reward_norm=dict(mean_level="batch", std_level="batch",
                                               std_unbiased=False, eps=1e-3),
                 adv_norm=dict(mean_level="group", std_level="group", group_size=3)),
            dict(discount=1.0, gae_lambda=1.0, values=False,
                 reward_norm=dict(mean_level="group", std_level=None, mean_leave1out=True,
                                  group_size=2)),
            dict(discount=0.95, gae_lambda=0.9,
                 reward_norm=dict(mean_level=None, std_level="group", group_size=3),
                 adv_norm=dict(mean_level="batch", std_level="batch")),
            dict(reward_norm=dict(mean_level="batch", std_level="group", mean_leave1out=True,
                                  group_size=2)),
            # group_size 4 over 6 rows: rows 4 and 5 are in no group
            dict(discount=0.95, gae_lambda=0.9,
                 reward_norm=dict(mean_level="group", std_level="group", group_size=4))]):
        full = dict(reward_bias=0.0, reward_scaling=1.0, reward_clip=20.0, kl_ctl=0.0,
                    kl_estimator="k1", discount=1.0, gae_lambda=1.0,
                    mask_no_eos_with_zero=False, adv_norm=None, values=True)
        full.update(cfg)
        g = torch.Generator().manual_seed(2400 + i)
        B, M = 6, 9
        attn = torch.zeros(B, M)
        lmask = torch.zeros(B, M, dtype=torch.bool)
        for r in range(B):
            p = int(torch.randint(1, 4, (1,), generator=g))
            seqlen = M if r % 3 == 1 else int(torch.randint(p + 1, M, (1,), generator=g))
            attn[r, :seqlen] = 1
            lmask[r, p:seqlen] = True
        data = {
            "input_ids": torch.zeros(B, M, dtype=torch.long),
            "attention_mask": attn,
            "loss_mask": lmask,
            "rewards": uni(g, (B,), -3.0, 3.0),
            "logprobs": uni(g, (B, M), -3.0, -0.05),
            "ref_logp": uni(g, (B, M), -3.0, -0.05),
        }
        if full["values"]:
            data["values"] = uni(g, (B, M), -1.0, 1.0)
        inputs = {k: tolist(v) for k, v in data.items() if k != "input_ids"}
        actor = object.__new__(PPOActor)
        actor.config = SimpleNamespace(overlong_reward_penalty=False, use_decoupled_loss=True,
                                       recompute_logprob=False)
        actor.reward_bias = full["reward_bias"]
        actor.reward_scaling = full["reward_scaling"]
        actor.reward_clip = full["reward_clip"]
        rnorm = None
        if "reward_norm" in full:
            rnorm = dict(dict(mean_level="batch", std_level="batch", mean_leave1out=False,
                              std_unbiased=True, eps=1e-5, group_size=1), **full["reward_norm"])
            full["reward_norm"] = rnorm
        actor.reward_norm = Normalization(NormConfig(**rnorm)) if rnorm else None
        actor.kl_ctl = full["kl_ctl"]
        actor.kl_estimator = KLEstimator(full["kl_estimator"])
        norm = None
        if full["adv_norm"] is not None:
            norm = dict(dict(mean_level="batch", std_level="batch", mean_leave1out=False,
                             std_unbiased=True, eps=1e-5, group_size=1), **full["adv_norm"])
            full["adv_norm"] = norm
        actor.adv_norm = Normalization(NormConfig(**norm)) if norm else None
        actor.discount = full["discount"]
        actor.gae_lambda = full["gae_lambda"]
        actor.mask_no_eos_with_zero = full["mask_no_eos_with_zero"]
        out = actor._compute_advantages(data)
        cases.append({
            "name": f"compute_advantages_{i}",
            "parameters": full,
            "inputs": inputs,
            "outputs": {"advantages": tolist(out["advantages"].double()),
                        "returns": tolist(out["returns"].double()),
                        "loss_mask": tolist(out["loss_mask"])},
        })
    w.write("PPOActor._compute_advantages",
            "padded: [batch, max_seqlen] rows aligned with input_ids; AReaL rolls loss_mask "
            "and logprobs by -1 (position t acts on token t + 1)", cases,
            "PPOActor._compute_advantages on an actor built with object.__new__ and the "
            "attributes its __init__ sets from PPOActorConfig (reward_norm as given, else None)")


def areal_legacy_vectors(path, w):
    """The older behaviour cap (behave_imp_weight_cap, behave_imp_weight_mode)
    that docs/losses.md maps onto rejection_sampling shorthands."""
    sys.path.insert(0, path)
    import areal.api.cli_args  # noqa: F401 (AReaL's own import order)
    import areal.utils.functional.functional as F
    layout = "packed: 1-D tokens, cu_seqlens, loss_mask (bool)"
    specs = [
        # name, seed, lens, empty, c_clip, cap, mode, level
        ("token_mask", 1, [6, 9, 4, 7], (), 3.0, 2.0, "token_mask", "token"),
        ("token_truncate", 2, [6, 9, 4, 7], (1,), None, 1.5, "token_truncate", "token"),
        ("sequence_mask", 3, [6, 9, 4, 7, 5, 8], (), None, 1.1, "sequence_mask", "token"),
        ("sequence_truncate", 4, [6, 9, 4, 7, 5], (), 3.0, 1.05, "sequence_truncate", "token"),
        ("disabled", 5, [6, 9, 4, 7], (), 3.0, None, "disabled", "token"),
        ("gspo_token_mask", 6, [3, 9, 2, 7, 2, 8], (), 3.0, 2.5, "token_mask", "sequence"),
        ("gspo_sequence_mask", 7, [6, 9, 4, 7, 5, 8], (2,), None, 1.1, "sequence_mask",
         "sequence"),
        ("gspo_token_truncate", 8, [6, 9, 4, 7, 5], (), None, 1.5, "token_truncate", "sequence"),
    ]
    cases = []
    for name, seed, lens, empty, c_clip, cap, mode, level in specs:
        seq = level == "sequence"
        inp = packed_inputs(3000 + seed, lens, empty,
                            log_ratio_prox=(lambda g, s: uni(g, s, -0.5, 0.5)) if seq else None,
                            behav_scale=0.6 if mode.startswith("sequence") else 1.2)
        lp = inp["logprobs"].clone().requires_grad_(True)
        loss, stat = F.ppo_actor_loss_fn(
            logprobs=lp, proximal_logprobs=inp["proximal_logprobs"],
            old_logprobs=inp["old_logprobs"], advantages=inp["advantages"], eps_clip=0.2,
            loss_mask=inp["loss_mask"], eps_clip_higher=0.28, c_clip=c_clip,
            behave_imp_weight_cap=cap, importance_sampling_level=level,
            cu_seqlens=inp["cu_seqlens"], behave_imp_weight_mode=mode)
        loss.backward()
        m = areal_actor_stats(stat, inp["loss_mask"], rejection=False)
        cases.append({
            "name": name,
            "parameters": {"eps_clip": 0.2, "eps_clip_higher": 0.28, "c_clip": c_clip,
                           "behave_imp_weight_cap": cap, "behave_imp_weight_mode": mode,
                           "importance_sampling_level": level},
            "inputs": {k: tolist(v) for k, v in inp.items()},
            "outputs": {"loss": num(loss), "grad_logprobs": tolist(lp.grad), "metrics": m},
        })
    w.write("ppo_actor_loss_fn", layout, cases,
            "metrics as areal/trainer/ppo/actor.py logs them from the returned stat dict")


def prime_rl_import(path):
    # prime_rl/__init__ is not needed; the configs live in a package of their own
    pkg = types.ModuleType("prime_rl")
    pkg.__path__ = [os.path.join(path, "src", "prime_rl"),
                    os.path.join(path, "packages", "prime-rl-configs", "src", "prime_rl")]
    sys.modules["prime_rl"] = pkg
    import prime_rl.trainer.rl.loss as loss
    from prime_rl.configs.trainer import DefaultLossConfig, IPOLossConfig
    return loss, DefaultLossConfig, IPOLossConfig


def prime_rl_vectors(path, w):
    L, DefaultLossConfig, IPOLossConfig = prime_rl_import(path)
    layout = "packed: 1-D tokens, cu_seqlens (prime-rl's per-sample lists), loss_mask (bool)"
    specs = [
        # name, seed, loss type, config, lens, rl_weights, ce_weights, ref_kl_weights
        ("default", 1, "default", {}, [6, 1, 9, 4, 7], False, False, False),
        ("default_knobs", 2, "default", dict(dppo_mask_low=0.1, dppo_mask_high=0.3, adv_tau=0.7,
                                             kl_tau=0.01), [7, 5, 8, 3, 6], False, False, False),
        ("default_weights_ce_ref_kl", 3, "default", {}, [6, 9, 4, 7, 5], True, True, True),
        ("ipo", 4, "ipo", {}, [6, 1, 9, 4, 7], False, False, False),
        ("ipo_knobs_weights", 5, "ipo", dict(ipo_threshold=0.05, adv_tau=1.5, kl_tau=0.02),
         [7, 5, 8, 3, 6], True, True, False),
    ]
    cases = []
    for name, seed, kind, cfg, lens, use_rl_w, use_ce, use_ref in specs:
        inp = packed_inputs(4000 + seed, lens, holes=0.2)
        g = torch.Generator().manual_seed(4100 + seed)
        n = sum(lens)
        mask = inp["loss_mask"]
        # inference logprobs: the anchors against the current policy
        infer = inp["logprobs"] - anchor_log_ratios(g, (n,))
        ref = inp["logprobs"] + uni(g, (n,), -1.0, 1.0)

        def weights(on):
            if not on:
                return None
            wt = torch.where(torch.rand(n, generator=g) < 0.25, 0.0, uni(g, (n,), 0.2, 2.0))
            # only on loss tokens: ours restrict every component to loss_mask
            # (docs/losses.md, `dppo` and `ipo`, "Differences from prime-rl")
            return torch.where(mask, wt, 0.0)

        rl_w, ce_w, ref_w = weights(use_rl_w), weights(use_ce), weights(use_ref)
        # normalizers: the rl component over every loss token (a token with
        # rl weight 0 stays in our normalizer), ce / ref_kl over their tokens
        rl_scale = int(mask.sum())
        ce_scale = int((ce_w != 0).sum()) if ce_w is not None else 1
        ref_scale = int((ref_w != 0).sum()) if ref_w is not None else 1
        conf = (DefaultLossConfig if kind == "default" else IPOLossConfig)(**cfg)
        cu = inp["cu_seqlens"].tolist()
        lp = inp["logprobs"].clone().requires_grad_(True)

        def split(t):
            return None if t is None else [t[cu[i]:cu[i + 1]] for i in range(len(lens))]

        loss, _ = L.compute_loss(
            trainer_logprobs=split(lp), inference_logprobs=split(infer),
            ref_logprobs=split(ref), advantages=split(inp["advantages"]),
            loss_mask=split(mask), rl_weights=split(rl_w), ce_weights=split(ce_w),
            ref_kl_weights=split(ref_w), rl_loss_fn=L.setup_rl_loss_fn(conf),
            rl_scale=rl_scale, ce_scale=ce_scale, ref_kl_scale=ref_scale)
        loss.backward()
        inputs = {"trainer_logprobs": inp["logprobs"], "inference_logprobs": infer,
                  "ref_logprobs": ref, "advantages": inp["advantages"], "loss_mask": mask,
                  "cu_seqlens": inp["cu_seqlens"]}
        for k, v in [("rl_weights", rl_w), ("ce_weights", ce_w), ("ref_kl_weights", ref_w)]:
            if v is not None:
                inputs[k] = v
        cases.append({
            "name": name,
            "parameters": dict(conf.model_dump(), rl_scale=rl_scale, ce_scale=ce_scale,
                               ref_kl_scale=ref_scale),
            "inputs": {k: tolist(v) for k, v in inputs.items()},
            "outputs": {"loss": num(loss), "grad_trainer_logprobs": tolist(lp.grad),
                        "metrics": {}},
        })
    w.write("compute_loss", layout, cases,
            "rl component by setup_rl_loss_fn(DefaultLossConfig | IPOLossConfig), plus the ce "
            "and ref_kl components when their weights are given")


def xorl_import(path):
    # xorl/ops/__init__ imports the Triton attention kernels; the losses need
    # only xorl/ops/loss: namespace stand-ins for the packages above it. Their
    # torch.compile is switched off (TORCHDYNAMO_DISABLE, set in main()): the
    # same Python runs eagerly.
    root = os.path.join(path, "src", "xorl")
    for name, sub in [("xorl", ""), ("xorl.ops", "ops"), ("xorl.ops.loss", "ops/loss")]:
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(root, sub)]
        sys.modules[name] = pkg
    import importlib
    return {m: importlib.import_module("xorl.ops.loss." + m)
            for m in ["policy_loss", "importance_sampling_loss", "cispo_loss", "causallm_loss",
                      "grpo_loss", "reducers"]}


def xorl_vectors(path, w):
    """xorl's losses take hidden states and the LM head weight: the vectors use
    the identity as the weight, so hidden_states are the logits, and record
    the selected-token logprobs xorl computes from them (its
    per_token_logprobs). d loss / d logprobs is minus the gradient reaching
    xorl's own per-token cross-entropy (its compute_per_token_ce, wrapped to
    keep that gradient); d loss / d logits is the gradient of the hidden states."""
    mods = xorl_import(path)
    captured = {}

    def keep_grad(fn):
        def wrapped(*a, **kw):
            ce = fn(*a, **kw)
            ce.retain_grad()
            captured["ce"] = ce
            return ce
        return wrapped

    for name in ["policy_loss", "importance_sampling_loss", "cispo_loss", "grpo_loss"]:
        mods[name].compute_per_token_ce = keep_grad(mods[name].compute_per_token_ce)
    layout = ("padded: [batch, seq] rows of next-token-aligned labels, -100 off the loss; "
              "logits [batch, seq, vocab] (hidden_states with an identity LM head)")
    V = 7

    def batch(seed, B, L, ignore=0.25):
        g = torch.Generator().manual_seed(seed)
        # logits exact in float32: xorl's eager CE computes in float32
        logits = uni(g, (B, L, V), -3.0, 3.0).float().double()
        labels = torch.randint(0, V, (B, L), generator=g)
        labels[torch.rand(B, L, generator=g) < ignore] = -100
        labels[0, 0] = 3  # at least one loss token
        return g, logits, labels

    def run(fn, seed, B, L, kw, extra=None, log_ratio=anchor_log_ratios):
        g, logits, labels = batch(seed, B, L)
        lp_true = torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        old = lp_true - log_ratio(g, (B, L))
        adv = signed(g, (B, L))
        inputs = dict(old_logprobs=old, advantages=adv)
        if extra:
            inputs.update(extra(g, lp_true, B, L))
        h = logits.clone().requires_grad_(True)
        out = fn(hidden_states=h, weight=torch.eye(V, dtype=torch.float64), labels=labels,
                 ce_mode="eager", **inputs, **kw)
        out.loss.backward()
        valid = labels != -100
        grad_lp = -captured.pop("ce").grad.view(B, L)
        metrics = {k: num(v) for k, v in out.metrics.items()}
        return {
            "parameters": dict(kw),
            "inputs": dict({k: tolist(v) for k, v in inputs.items()}, labels=tolist(labels),
                           logits=tolist(logits)),
            "outputs": {"loss": num(out.loss),
                        "logprobs": tolist(out.per_token_logprobs.double().masked_fill(~valid, 0)),
                        "grad_logprobs": tolist(grad_lp.masked_fill(~valid, 0)),
                        "grad_logits": tolist(h.grad), "metrics": metrics},
        }

    def named_runs(name, fn, seed, B, L, kws):
        """run(fn) once per keyword set of kws (seeds seed, seed + 1, ...), as the
        cases name_0, name_1, ..."""
        cases = []
        for i, kw in enumerate(kws):
            case = run(fn, seed + i, B, L, kw)
            case["name"] = f"{name}_{i}"
            cases.append(case)
        return cases

    def rollout(g, lp, B, L):
        return {"rollout_logprobs": lp - uni(g, (B, L), -0.9, 0.9)}

    pl = mods["policy_loss"].policy_loss_function
    cases = []
    for i, (kw, extra) in enumerate([
            (dict(), None),
            (dict(eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=3.0, compute_kl_stats=True), None),
            (dict(eps_clip=0.1, eps_clip_high=0.3, use_tis=True, tis_clip_low=0.5,
                  tis_clip_high=1.5), rollout),
            (dict(eps_clip=0.2, eps_clip_high=0.28, icepop_beta=2.0, compute_kl_stats=True), None),
            (dict(eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=2.0, icepop_beta=3.0, use_tis=True,
                  tis_clip_low=0.1, tis_clip_high=2.0), rollout)]):
        case = run(pl, 5000 + i, 5, 9, kw, extra)
        case["name"] = f"policy_loss_{i}"
        cases.append(case)
    w.write("policy_loss_function", layout, cases,
            "TokenPartial over labels != -100 (xorl's default reducer); logprobs = xorl's "
            "per_token_logprobs")

    isl = mods["importance_sampling_loss"].importance_sampling_loss_function
    w.write("importance_sampling_loss_function", layout,
            named_runs("importance_sampling", isl, 5100, 6, 8,
                       [dict(), dict(compute_kl_stats=True)]))

    cispo = mods["cispo_loss"].cispo_loss_function
    w.write("cispo_loss_function", layout,
            named_runs("cispo", cispo, 5200, 6, 8,
                       [dict(), dict(clip_low_threshold=0.8, clip_high_threshold=1.28,
                                     compute_kl_stats=True),
                        dict(clip_low_threshold=0.0, clip_high_threshold=2.0)]))

    # the z-loss: xorl has it on causallm_loss_function (z_loss_coef) only
    ce = mods["causallm_loss"].causallm_loss_function
    cases = []
    for i, (coef, B, L) in enumerate([(0.0, 4, 7), (1e-2, 5, 9), (0.3, 3, 6)]):
        _, logits, labels = batch(5300 + i, B, L)
        h = logits.clone().requires_grad_(True)
        out = ce(hidden_states=h, weight=torch.eye(V, dtype=torch.float64), labels=labels,
                 ce_mode="eager", z_loss_coef=coef)
        out.loss.backward()
        cases.append({
            "name": f"causallm_z_loss_{i}",
            "parameters": {"z_loss_coef": coef},
            "inputs": {"labels": tolist(labels), "logits": tolist(logits)},
            "outputs": {"loss": num(out.loss), "grad_logits": tolist(h.grad),
                        "metrics": {k: num(v) for k, v in (out.metrics or {}).items()}},
        })
    w.write("causallm_loss_function", layout, cases,
            "mean cross-entropy over labels != -100 plus z_loss_coef * mean logsumexp(logits)^2")

    # drgrpo: PPO clip-higher plus beta * the k1 / k2 / k3 estimator against
    # ref_logprobs, token or sequence ratio; its default reducer is the token
    # mean (TokenPartial(scale=loss_mask.sum())). Two cases pass the other
    # reducers of xorl.ops.loss.reducers: TokenPartial with Dr. GRPO's constant
    # scale (rows x max length) and SequencePartial (mean of the rows' token means).
    drgrpo = mods["grpo_loss"].drgrpo_loss_function
    red = mods["reducers"]
    cases = []
    B, L = 5, 8
    for i, (kw, reducer, seq_adv) in enumerate([
            (dict(), None, False),  # xorl's defaults: beta 0.1, k3, clip 0.2 / 0.28
            (dict(beta=0.0), None, False),
            (dict(beta=0.05, kl_type="k1"), None, False),
            (dict(beta=0.2, kl_type="k2", clip_low=0.1, clip_high=0.3), None, False),
            (dict(beta=0.1, kl_type="k3"), "token_constant", False),
            (dict(beta=0.1, kl_type="k2", clip_low=0.2, clip_high=0.2), "sequence", False),
            (dict(beta=0.05, kl_type="k3", ratio_type="sequence", clip_low=0.1,
                  clip_high=0.15), None, True)]):
        g, logits, labels = batch(5400 + i, B, L)
        labels[:, 0] = labels[:, 0].clamp(min=0)  # every row has a loss token
        lp_true = torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        if kw.get("ratio_type") == "sequence":
            # a log-ratio per row, so that some sequences fall outside the clip band
            old = lp_true - uni(g, (B, 1), -0.3, 0.3) - uni(g, (B, L), -0.05, 0.05)
        else:
            old = lp_true - anchor_log_ratios(g, (B, L))
        adv = signed(g, (B, 1)).expand(B, L).clone() if seq_adv else signed(g, (B, L))
        inputs = dict(old_logprobs=old, advantages=adv)
        if kw.get("beta", 0.1) > 0:
            inputs["ref_logprobs"] = lp_true + uni(g, (B, L), -1.5, 1.5)
        valid = labels != -100
        n_tok = valid.sum()
        params = dict(kw)
        extra = {}
        if reducer == "token_constant":
            extra["loss_reducer"] = red.TokenPartial(scale=torch.tensor(float(B * L)))
            params["loss_reducer"] = {"type": "TokenPartial", "scale": B * L}
        elif reducer == "sequence":
            extra["loss_reducer"] = red.SequencePartial(
                scale=torch.tensor(float(B)), cu_seqlens_local=torch.arange(B + 1) * L,
                seq_lengths_global=valid.sum(-1).double())
            params["loss_reducer"] = {"type": "SequencePartial", "scale": B,
                                      "seq_lengths_global": "loss tokens of each row"}
        else:
            params["loss_reducer"] = {"type": "TokenPartial", "scale": int(n_tok)}
        h = logits.clone().requires_grad_(True)
        out = drgrpo(hidden_states=h, weight=torch.eye(V, dtype=torch.float64), labels=labels,
                     ce_mode="eager", **inputs, **kw, **extra)
        out.loss.backward()
        grad_lp = -captured.pop("ce").grad.view(B, L)
        cases.append({
            "name": f"drgrpo_{i}",
            "parameters": params,
            "inputs": dict({k: tolist(v) for k, v in inputs.items()}, labels=tolist(labels),
                           logits=tolist(logits)),
            "outputs": {"loss": num(out.loss),
                        "logprobs": tolist(out.per_token_logprobs.double().masked_fill(~valid, 0)),
                        "grad_logprobs": tolist(grad_lp.masked_fill(~valid, 0)),
                        "grad_logits": tolist(h.grad),
                        "metrics": {k: num(v) for k, v in out.metrics.items()}},
        })
    w.write("drgrpo_loss_function", layout, cases,
            "per-token max(-r A, -clip(r, 1 - clip_low, 1 + clip_high) A) + beta * k(logprobs, "
            "ref_logprobs), reduced by parameters.loss_reducer (xorl's default: TokenPartial over "
            "labels != -100, the token mean); metrics are token means over labels != -100")


def surogate_import(path):
    # surogate/grpo/loss.py is Surogate's Python reference of its per-token GRPO
    # gradient seeds (the native CUDA step is checked against it; the
    # turn_diagnostics route runs it). Its config module imports the SFT
    # trainer's config only to derive GRPOTrainConfig from it: a stand-in class
    # for that base (GRPOLossConfig, the dataclass used here, does not touch it).
    root = os.path.join(path, "surogate")
    for name, sub in [("surogate", ""), ("surogate.grpo", "grpo"), ("surogate.core", "core"),
                      ("surogate.core.config", "core/config")]:
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(root, sub)]
        sys.modules[name] = pkg
    sft = types.ModuleType("surogate.core.config.sft_config")
    sft.SFTConfig = type("SFTConfig", (), {})
    sys.modules[sft.__name__] = sft
    import importlib
    return importlib.import_module("surogate.grpo.loss")


def surogate_vectors(path, w):
    import dataclasses

    import numpy as np
    L = surogate_import(path)
    layout = "packed: 1-D tokens, cu_seqlens (Surogate's sample_ranges), loss_mask (bool)"
    specs = [
        # name, seed, config, lens, teacher, replay, opd
        ("ipo_default", 1, {}, [6, 1, 9, 4, 7], False, False, False),
        ("ipo_asymmetric_clip", 2, dict(ipo_mask_low=0.05, ipo_mask_high=0.3, adv_tau=0.7,
                                        kl_tau=0.02, ratio_clip=2.0), [7, 5, 8, 3, 6],
         False, False, False),
        ("ipo_teacher", 3, dict(teacher_tau=0.5, kl_tau=0.01, ratio_clip=4.0), [6, 9, 4, 7, 5],
         True, False, False),
        ("ipo_replay", 4, dict(replay_tau=0.5), [6, 9, 4, 7, 5], False, True, False),
        ("ipo_opd", 5, dict(opd_tau=0.3, opd_beta=2.0), [7, 5, 8, 3, 6], False, False, True),
    ]
    cases = []
    for name, seed, cfg, lens, use_teacher, use_replay, use_opd in specs:
        inp = packed_inputs(6000 + seed, lens, empty=(1,) if seed == 1 else (), holes=0.2)
        g = torch.Generator().manual_seed(6100 + seed)
        n = sum(lens)
        lp = inp["logprobs"]
        infer = lp - anchor_log_ratios(g, (n,))
        mask = inp["loss_mask"]
        cu = inp["cu_seqlens"].tolist()
        extra = {}
        if use_teacher:
            extra["teacher_logprobs"] = lp + uni(g, (n,), -1.0, 1.0)
        if use_replay:
            replay = (torch.rand(n, generator=g) < 0.3) & mask
            extra["replay_mask"] = replay
            extra["replay_weights"] = torch.where(replay, uni(g, (n,), 0.5, 2.0), 1.0)
        if use_opd:
            extra["opd_reference_logprobs"] = lp + uni(g, (n,), -0.5, 0.5)
            extra["hindsight_logprobs"] = lp + uni(g, (n,), -1.0, 1.0)
            extra["hindsight_mask"] = torch.rand(n, generator=g) < 0.5
        conf = L.GRPOLossConfig(**cfg)
        np_extra = {k: v.numpy() for k, v in extra.items()}
        grads, metrics = L.compute_grpo_per_token_grads(
            trainer_logprobs=lp.numpy(), inference_logprobs=infer.numpy(),
            advantages=inp["advantages"].numpy(), loss_mask=mask.numpy(), loss_config=conf,
            sample_ranges=[(cu[i], cu[i + 1]) for i in range(len(lens))], **np_extra)
        inputs = {"trainer_logprobs": lp, "inference_logprobs": infer,
                  "advantages": inp["advantages"], "loss_mask": mask, "cu_seqlens": inp["cu_seqlens"]}
        inputs.update(extra)
        cases.append({
            "name": name,
            "parameters": dataclasses.asdict(conf),
            "inputs": {k: tolist(v) for k, v in inputs.items()},
            "outputs": {"per_token_grads": [float(x) for x in np.asarray(grads, dtype=np.float64)],
                        "loss_scale": int(mask.sum()),
                        "metrics": {k: float(v) for k, v in metrics.items()}},
        })
    w.write("compute_grpo_per_token_grads", layout, cases,
            "per_token_grads are Surogate's CE-backward seeds, -d loss / d trainer_logprobs "
            "before its division by loss_scale (the step's loss tokens); metrics are means over "
            "samples of per-sample values (policy_loss: of per-sample token means)")


def main():
    global torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verl", help="checkout of volcengine/verl at the pinned commit")
    ap.add_argument("--areal", help="checkout of inclusionAI/AReaL at the pinned commit")
    ap.add_argument("--prime-rl", help="checkout of PrimeIntellect-ai/prime-rl at the pinned commit")
    ap.add_argument("--areal-legacy", help="checkout of inclusionAI/AReaL at the pinned older "
                    "commit (behave_imp_weight_mode); run in a process of its own")
    ap.add_argument("--xorl", help="checkout of togethercomputer/xorl at the pinned commit")
    ap.add_argument("--surogate", help="checkout of invergent-ai/surogate at the pinned commit")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "vectors"))
    args = ap.parse_args()
    if not (args.verl or args.areal or args.areal_legacy or args.prime_rl or args.xorl
            or args.surogate):
        ap.error("name at least one peer checkout (--verl, --areal, --areal-legacy, --prime-rl, "
                 "--xorl, --surogate)")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # xorl's torch.compile: run eagerly
    if args.areal_legacy and (args.verl or args.areal):
        # both AReaL trees are the package `areal`: the older one in a process of its own
        subprocess.run([sys.executable, os.path.abspath(__file__), "--areal-legacy",
                        args.areal_legacy, "--out", args.out], check=True)
        args.areal_legacy = None
    import torch as _torch
    torch = _torch
    torch.set_default_dtype(torch.float64)
    # peer (PINS and vectors/<peer>), its checkout, what writes its vectors
    for peer, path, vectors in [("verl", args.verl, verl_vectors),
                                ("areal", args.areal, areal_vectors),
                                ("prime-rl", args.prime_rl, prime_rl_vectors),
                                ("xorl", args.xorl, xorl_vectors),
                                ("surogate", args.surogate, surogate_vectors),
                                ("areal_legacy", args.areal_legacy, areal_legacy_vectors)]:
        if path:
            check_checkout(peer, path)
            vectors(os.path.abspath(path), Writer(args.out, peer))


if __name__ == "__main__":
    main()
