"""lm-evaluation-harness's command line with the lssa variants registered first.

    python -m lssa.lm_eval --model hf --model_args pretrained=DIR,add_bos_token=True --tasks ...

takes every argument of ``lm_eval`` (``lm_eval run``) and runs it after ``import lssa.hf``, so an
export of ``trainer export --format hf`` whose ``config.json`` names an lssa attention
(``attn_implementation``) loads (plain ``lm_eval`` refuses the unknown implementation), and
``--model_args ...,attn_implementation=lssa+rw15`` evaluates post-hoc re-weighting. A softmax export
needs none of this: plain ``lm_eval`` scores it. Needs the ``eval`` extra (``pip install
"lssa[hf,eval]"``); ``lm_eval_tasks/`` beside this package's sources holds task definitions that read
local multiple-choice files.
"""

import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Runs lm_eval's command line on ``argv`` (default: this process's arguments)."""
    import lssa.hf  # noqa: F401 (registers the variants with transformers)
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


if __name__ == "__main__":
    main()
