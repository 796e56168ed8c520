#!/usr/bin/env python3
"""Reads dtrain's TensorBoard event files with TensorBoard's own loader (EventAccumulator).

An independent check that what dtrain writes is what TensorBoard reads: every file is loaded with
tensorboard.backend.event_processing.plugin_event_accumulator (the loader behind
`tensorboard --load_fast=false`), every tag is printed with its plugin, step and value, and the
rules RustBoard applies to scalars (DT_FLOAT, rank 0) are checked. Optional expectations make it a
test:

  python3 tools/check_events_with_tensorboard.py logs/run1/train \
      --expect-scalar loss 0 1.0 --expect-text fault 1200 "signal 9"

Needs a Python with the `tensorboard` package (pip install tensorboard); Debian has no package for
it, so dtrain's own tests do not use this script: tests/summary/event_test.cc checks the bytes
against a file TensorFlow wrote instead. Exit status: 0 ok, 1 a check failed, 2 usage or
tensorboard missing.
"""

import argparse
import math
import os
import sys


def load(path):
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea

    acc = pea.EventAccumulator(path, size_guidance={pea.TENSORS: 0})  # 0: keep every event
    acc.Reload()
    return acc


def describe(acc, tag):
    from tensorboard.util import tensor_util

    plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
    rows = []
    for ev in acc.Tensors(tag):
        value = tensor_util.make_ndarray(ev.tensor_proto)
        rows.append((ev.step, ev.wall_time, ev.tensor_proto.dtype, value))
    return plugin, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="event files or run directories")
    parser.add_argument("--expect-scalar", nargs=3, action="append", default=[],
                        metavar=("TAG", "STEP", "VALUE"), help="a scalar that must be there")
    parser.add_argument("--expect-text", nargs=3, action="append", default=[],
                        metavar=("TAG", "STEP", "SUBSTRING"), help="a text entry that must be there")
    args = parser.parse_args()
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        print("check_events_with_tensorboard: the 'tensorboard' Python package is not installed "
              "(pip install tensorboard)", file=sys.stderr)
        return 2

    scalars, texts, failures = {}, {}, []
    for path in args.paths:
        if not os.path.exists(path):
            print(f"check_events_with_tensorboard: {path}: no such file or directory",
                  file=sys.stderr)
            return 2
        acc = load(path)
        tags = acc.Tags().get("tensors", [])
        print(f"# {path}: {len(tags)} tags")
        if not tags:
            failures.append(f"{path}: TensorBoard found no tags")
        for tag in sorted(tags):
            plugin, rows = describe(acc, tag)
            for step, wall_time, dtype, value in rows:
                if plugin == "scalars":
                    # RustBoard (the default loader) accepts only DT_FLOAT (1) rank-0 scalars.
                    if dtype != 1 or value.ndim != 0:
                        failures.append(f"{tag}@{step}: scalar with dtype {dtype}, "
                                        f"shape {value.shape}: RustBoard would reject it")
                    scalars[(tag, step)] = float(value)
                    print(f"{wall_time:.6f} step={step} scalar {tag} = {float(value)!r}")
                elif plugin == "text":
                    text = "\n".join(x.decode("utf-8") for x in value.reshape(-1))
                    texts[(tag, step)] = text
                    print(f"{wall_time:.6f} step={step} text {tag}: {text!r}")
                else:
                    print(f"{wall_time:.6f} step={step} {plugin} {tag}: shape {value.shape}")

    for tag, step, expected in args.expect_scalar:
        got = scalars.get((tag, int(step)))
        if got is None or not math.isclose(got, float(expected), rel_tol=1e-6, abs_tol=1e-12):
            failures.append(f"scalar {tag}@{step}: expected {expected}, got {got}")
    for tag, step, part in args.expect_text:
        got = texts.get((tag, int(step)))
        if got is None or part not in got:
            failures.append(f"text {tag}@{step}: expected to contain {part!r}, got {got!r}")
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    print(f"{len(scalars)} scalars, {len(texts)} text entries, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
