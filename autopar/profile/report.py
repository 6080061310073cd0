"""What `autopar profile` prints: the measured figures, the fits and their residuals."""

from __future__ import annotations


def summary_dict(doc: dict) -> dict:
    """The headline numbers of a profile (for --json)."""
    comp, comm, mem = doc["compute"], doc["communication"], doc["memory"]
    return {
        "device": doc["device"],
        "model": {k: doc["model"][k] for k in ("name", "seq_len", "dtype_bytes")},
        "peak_tflops": comp["peak_tflops"],
        "hbm_gbps": comp["hbm_gbps"],
        "compute_fit": comp["fit"],
        "comm_fits": comm["fits"],
        "link": comm.get("link"),
        "state_table": {z: {"a": r["a"], "b": r["b"]} for z, r in mem["state_table"].items()},
    }


def profile_summary(doc: dict) -> str:
    """A few readable tables: device, compute curves, collectives per group size, memory model."""
    d, comp, comm, mem = doc["device"], doc["compute"], doc["communication"], doc["memory"]
    lines = [f"autopar profile: {d['type']} ({d['name']}), {d['nproc']} processes, {d['backend']}, torch {doc['torch']}, "
             f"model {doc['model']['name']} seq {doc['model']['seq_len']}",
             f"matmul peak {comp['peak_tflops'] * 1e3:.1f} GFLOPS per process, copy {comp['hbm_gbps']:.1f} GB/s, "
             f"{comp['optimizer']['name']} step {comp['optimizer']['seconds'] * 1e3:.2f} ms "
             f"({comp['optimizer']['opt_bytes_touched']:.1f} B/param at that bandwidth)",
             "compute curve per layer kind: t = FLOPs / (peak x eff_max) + overhead per call (fwd; bwd 2x)"]
    rows = [("all tp1", comp["fit"]["all"])] + list(comp["fit"]["by_kind"].items())
    for kind, f in rows:
        if f:
            lines.append(f"  {kind:<10} eff_max {f['eff_max']:.3f}  overhead {f['layer_overhead_s'] * 1e6:8.1f} us  "
                         f"rel. rms {f['rel_rms']:.3f}  ({f['samples']} samples)")
    for unit, z in comp.get("zero_flop_units", {}).items():
        lines.append(f"  {unit:<10} no FLOPs: {z['seconds_per_sample'] * 1e6:.1f} us per sample, modelled as 0")
    if comm["fits"]:
        lines.append("collectives: t = alpha + bytes x beta (rel. rms of the fit)")
        for n, per in sorted(comm["fits"].items()):
            cells = [f"{c} {f['alpha_s'] * 1e6:.0f} us + {1 / max(f['beta_s_per_byte'], 1e-18) / 1e9:.2f} GB/s "
                     f"({f['rel_rms']:.2f})" for c, f in per.items()]
            lines.append(f"  n={n}: " + "; ".join(cells))
        for c, g in comm["genmodel"].items():
            lines.append(f"  GenModel {c:<15} terms {'+'.join(g['terms']):<22} rel. rms {g['rel_rms']:.3f} "
                         f"(alpha-beta only {g['rel_rms_alpha_beta']:.3f}) over groups {g['group_sizes']}")
        link = comm["link"]
        lines.append(f"  link (p2p): {link['bw_gbps']:.2f} GB/s, {link['lat_us']:.1f} us")
    lines.append("model states, bytes per parameter on a DP group of d: " + ", ".join(
        f"{z}: {r['a']:g} + {r['b']:g}/d" for z, r in mem["state_table"].items()))
    lines.append("saved activations per sample (bytes): unit  none / selective / full  -> tp, seq, attn split")
    for unit, r in mem["units"].items():
        m = r["measured"]
        lines.append(f"  {unit:<10} {m['none']:>10.0f} / {m['selective']:>10.0f} / {m['full']:>9.0f}  -> "
                     f"{r['act_tp_bytes']:.0f}, {r['act_seq_bytes']:.0f}, {r['act_attn_bytes']:.0f}"
                     + (f"  (tp2+sp measured {m['none_tp2_sp']:.0f}, model {r['predicted_tp2_sp']:.0f})"
                        if "none_tp2_sp" in m else ""))
    return "\n".join(lines)
