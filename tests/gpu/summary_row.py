"""A GPU run's summary.json (tests/gpu/run_gpu_checks.sh) as a row of docs/gpu.md's table of runs.

    python3 tests/gpu/summary_row.py OUT_DIR/summary.json [--header]

Every step gets a verdict in the row: passed (with its seconds and what it found), FAILED,
not selected (DDPL_GPU_STEPS), not run (the run's time ran out), and the parts a passed step
skipped (e.g. the overlap check on a one-GPU host).
"""
import json
import sys

STEPS = ["unpack", "build", "doctor", "gpus", "build_worker", "throw_site", "nccl", "train",
         "throughput", "scaler", "autobatch", "liveview", "prewarm"]


def verdict(step):
    status = step.get("status") or ("passed" if step.get("rc") == 0 else "failed")
    if status == "passed":
        text = f"ok {step['seconds']:.0f}s"
        if step.get("detail"):
            text += ": " + " ".join(step["detail"].split())
        for s in step.get("skipped", []):
            text += f" (skipped: {s})"
        return text
    if status == "failed":
        return f"**FAILED** (exit {step.get('rc')}, {step['seconds']:.0f}s of {step.get('limit', '?')}s)"
    return status


def main():
    summary = json.load(open(sys.argv[1]))
    by_name = {s["step"]: s for s in summary["steps"]}
    cells = [summary.get("date", "?"),
             f"{summary.get('host', '?')}: {', '.join(summary.get('gpus', [])) or 'no GPU'}",
             f"torch {summary.get('torch', '?')} (CUDA {summary.get('cuda', '?')})",
             summary.get("status", "?")]
    cells += [verdict(by_name[n]) if n in by_name else "not reached" for n in STEPS]
    if "--header" in sys.argv:
        names = ["date", "host", "torch", "run"] + STEPS
        print("| " + " | ".join(names) + " |")
        print("|" + "---|" * len(names))
    print("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")


if __name__ == "__main__":
    main()
