"""The bench's fixed-width text report of the JSON results."""

from __future__ import annotations

from typing import Any

from pipeline.tools.bench.video import format_video


def format_table(res: dict[str, Any]) -> str:
    lines = [f"device {res['device']}{' (' + res['device_name'] + ')' if 'device_name' in res else ''}  "
             f"torch {res['torch']}  threads {res['threads']}",
             "matmul peak: " + ", ".join(f"{k} {v / 1e9:8.1f} GFLOP/s" for k, v in res["matmul_peak_flops"].items())]
    lines.append("")
    w = max([16, *map(len, res["train"])])
    lines.append(f"{'training':<{w}} {'px':>4} {'batch':>5} {'real img/s':>11} {'synth img/s':>11} "
                 f"{'real/synth':>10} {'wait':>6} {'GFLOP/img':>9} {'eff synth':>9} {'eff real':>9} {'warm-up s':>9}")
    for preset, t in res["train"].items():
        lines.append(f"{preset:<{w}} {t['input_size']:>4} {t['batch_size']:>5} {t['images_per_s_real']:>11.1f} "
                     f"{t['images_per_s_synthetic']:>11.1f} {t['ratio_real_synthetic']:>10.3f} "
                     f"{100 * t['data_wait_frac_real']:>5.1f}% "
                     f"{t['train_flops_per_image'] / 1e9:>9.3f} {100 * t['compute_efficiency_synthetic']:>8.1f}% "
                     f"{100 * t['compute_efficiency_real']:>8.1f}% {t.get('warmup_s', float('nan')):>9.1f}")
    sbs = res.get("train_side_by_side")
    if sbs:
        lines.append(f"{sbs['processes']} processes side by side ({' + '.join(map(str, sbs['threads']))} threads, "
                     f"as train-folds): {sbs['images_per_s_real']:.1f} real img/s together ("
                     f"{' + '.join(f'{r:.1f}' for r in sbs['images_per_s_per_process'])}), "
                     f"{sbs['ratio_to_one_process']:.2f}x the row '{sbs['row']}'")
    lines.append("")
    keys = [k for k in next(iter(res["infer"].values())) if k not in ("batch", "input_size")] if res["infer"] else []
    if keys:
        batch = next(iter(res["infer"].values()))["batch"]
        lines.append(f"inference faces/s (bsN = batch {batch}; flip = flip TTA, 2 forwards)")
        lines.append(f"{'preset':<16} {'px':>4} " + " ".join(f"{k:>16}" for k in keys))
        for preset, r in res["infer"].items():
            lines.append(f"{preset:<16} {r['input_size']:>4} " + " ".join(f"{r[k]:>16.1f}" for k in keys))
    lines.append("")
    acc = res["accuracy"]
    if "skipped" in acc:
        lines.append(f"accuracy: skipped ({acc['skipped']})")
    else:
        lines.append(f"accuracy on {acc['data']} ({acc['n_test']} test faces)")
        if acc.get("test_xml_comment"):
            lines.append(f"  the test XML says: {acc['test_xml_comment']}")
        lines.append(f"{'method':<40} {'MAE px':>8} {'NME %':>7} {'faces/s':>9} {'faces/s 1 thr':>13}")
        for name, r in acc.items():
            if not isinstance(r, dict):
                continue
            if "skipped" in r:
                lines.append(f"{name:<40} skipped: {r['skipped']}")
                continue
            fps = r.get("faces_per_s", float("nan"))
            fps1 = r.get("faces_per_s_1thread", float("nan"))
            label = name if len(name) <= 40 else "..." + name[-37:]
            lines.append(f"{label:<40} {r['mae']:>8.3f} {100 * r['nme']:>7.2f} {fps:>9.1f} {fps1:>13.1f}")
            if r.get("boxes"):
                lines.append(f"  boxes: {r['boxes']}")
    lines += [""] + format_batch1(res.get("batch1"), res.get("batch1_model"))
    for preset, b1 in res.get("batch1_presets", {}).items():
        lines += [""] + format_batch1(b1, f"{preset} (untrained)")
    if res.get("video"):
        lines += [""] + format_video(res["video"])
    lines += [""] + format_detectors(res.get("detectors", {"skipped": "not run"}))
    return "\n".join(lines)


def format_batch1(b1: dict[str, Any] | None, model: str | None) -> list[str]:
    if not b1:
        return []
    ref = b1.get("dlib", {}).get("plain")
    lines = [f"one face at a time, one core (batch 1, 1 thread; {model}; {b1['faces']} crops of "
             f"{b1['crop_size']} px -> input {b1['input_size']} px; best of {b1['rounds']} alternating rounds): "
             "faces/s" + (", x dlib" if ref else ""),
             f"{'backend':<40} {'plain':>9} {'flip TTA':>9} {'+ score':>9} {'score ms':>8}"
             + (f" {'plain/dlib':>10} {'flip/dlib':>10}" if ref else "")]
    for name in ("torch-eager", "torch", "onnx", "onnx-int8"):
        r = b1.get(name)
        if r is None:
            continue
        if "skipped" in r:
            lines.append(f"{name:<40} skipped: {r['skipped']}")
            continue
        scored = r.get("scored", float("nan"))  # flip TTA and the presence score; ms: its cost per face
        row = (f"{name:<40} {r['plain']:>9.1f} {r['flip']:>9.1f} {scored:>9.1f} "
               f"{1000 * (1 / scored - 1 / r['flip']):>8.3f}")
        if ref:
            row += f" {r['plain'] / ref:>10.2f} {r['flip'] / ref:>10.2f}"
        lines.append(row)
    if ref:
        lines.append(f"{'dlib 68-point predictor (same crops)':<40} {ref:>9.1f}")
        if b1["dlib"].get("boxes"):
            lines.append(f"  boxes: {b1['dlib']['boxes']}")
    elif "dlib" in b1:
        lines.append(f"{'dlib':<40} skipped: {b1['dlib']['skipped']}")
    return lines


def format_detectors(det: dict[str, Any]) -> list[str]:
    if "skipped" in det:
        return [f"face detectors: skipped ({det['skipped']})"]
    lines = [f"face detectors on {det['xml']} (recall at IoU >= 0.5 of the converted boxes; unmatched detections "
             "include real faces the XML does not label)",
             f"{'detector':<44} {'recall':>7} {'unmatched/photo':>15} {'median IoU':>10} {'photos/s 1 thr':>14}"]
    for name, r in det.items():
        if not isinstance(r, dict):
            continue
        if "skipped" in r:
            lines.append(f"{name:<44} skipped: {r['skipped']}")
            continue
        label = f"{name}: {r['detector']}"[:44]
        lines.append(f"{label:<44} {100 * r['recall']:>6.1f}% {r['unmatched_per_photo']:>15.3f} "
                     f"{r['median_iou']:>10.3f} {r['photos_per_s']:>14.1f}")
    return lines
