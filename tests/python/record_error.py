"""Fails on rank 1 through torch's @record, which writes TORCHELASTIC_ERROR_FILE."""
import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("learning rate must be positive, got -0.5")
    print("rank", os.environ["RANK"], "fine")


if __name__ == "__main__":
    main()
