"""Exit 0 iff two torch.save'd state dicts hold the same tensors, bit for bit (torch.equal);
else print the first name that differs and exit 1.

Usage: ckpt_equal.py A.pt B.pt"""
import sys

import torch


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    a, b = (torch.load(path, map_location="cpu") for path in sys.argv[1:])
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {sys.argv[1] if name in a else sys.argv[2]}")
            return 1
        x, y = a[name], b[name]
        same = (torch.equal(x, y) and x.dtype == y.dtype) if isinstance(x, torch.Tensor) \
            and isinstance(y, torch.Tensor) else x == y
        if not same:
            print(f"{name}: differs")
            return 1
    print(f"equal: {len(a)} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
