"""A training function that does not use torch (as a scikit-learn or XGBoost one would not): it reports whether its
worker process has imported torch; ``ask_device`` makes it ask the context for its torch device first."""

import sys


def train(config, ctx):
    if config.get("ask_device"):
        assert str(ctx.device) == "cpu"
    for epoch in range(ctx.start_epoch, ctx.end_epoch):
        ctx.report(epoch, torch_loaded=float("torch" in sys.modules), grouped=float(ctx.process_group is not None))
