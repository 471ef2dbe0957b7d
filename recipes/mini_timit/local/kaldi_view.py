"""Give the built-in corpus the names of a Kaldi recipe's outputs, so that cfg/TIMIT_*, cfg/WSJ_* and
cfg/AMI_* run on it unchanged: symbolic links under VIEW, and the ``export`` lines for their variables.

The phone task stands in for TIMIT (egs/timit/s5), the word task for WSJ (egs/wsj/s5, the tgpr graph)
and AMI (egs/ami/s5b). Nothing is copied; the links point into ROOT.

Usage: python -m recipes.mini_timit.local.kaldi_view [--task phones|words] VIEW [ROOT]
  e.g. eval "$(python -m recipes.mini_timit.local.kaldi_view --task words exp/kaldi_view)"
       python run_exp.py cfg/WSJ_liBRU.cfg --exp,out_folder=exp/WSJ_liBRU_mini --exp,n_epochs_tr=8
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

RECIPE_DIR = Path(__file__).resolve().parents[1]
SPLITS = ("train", "dev", "test")


def names(task: str) -> dict[str, dict[str, str]]:
    """``{variable: {Kaldi's name: the corpus's path}}`` for ``task``."""
    data = [f"data/{s}" + ("_words" if task == "words" else "") for s in SPLITS]
    ali = [f"exp/mono{'_words' if task == 'words' else ''}_ali_{s}" for s in SPLITS]
    graph = "exp/mono_words/graph_tgpr" if task == "words" else "exp/mono/graph"
    return {
        "TIMIT_FMLLR": dict(zip(SPLITS, data)),
        "TIMIT_EXP": dict(zip(("tri3_ali", "tri3_ali_dev", "tri3_ali_test"), ali), **{"tri3/graph": graph}),
        "WSJ_FMLLR": dict(zip(("train_si284", "test_dev93", "test_eval92"), data)),
        "WSJ_EXP": dict(zip(("tri4b_ali_si284", "tri4b_ali_dev93", "tri4b_ali_eval92"), ali),
                        **{"tri4b/graph_tgpr": graph}),
        "AMI_FMLLR": dict(zip(("train", "dev", "eval"), data)),
        "AMI_EXP": dict(zip(("tri3_ali", "tri3_ali_dev", "tri3_ali_eval"), ali),
                        **{"tri3/graph_ami_fsh.o3g.kn.pr1-7": graph}),
    }


def make_view(view: Path, root: Path, task: str = "words") -> dict[str, Path]:
    """Create the links under ``view`` (replacing earlier ones); returns ``{variable: folder}``."""
    root = Path(root).resolve()
    folders = {}
    for variable, links in names(task).items():
        folder = Path(view).resolve() / variable
        for name, target in links.items():
            if not (root / target).exists():
                raise FileNotFoundError(f"{root / target} does not exist: build the {task} task first "
                                        f"(bash {RECIPE_DIR / 'run.sh'} --task {task} {root})")
            link = folder / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.unlink(missing_ok=True)
            link.symlink_to(root / target, target_is_directory=True)
        folders[variable] = folder
    return folders


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=("phones", "words"), default="words")
    parser.add_argument("view", type=Path, help="where the links go")
    parser.add_argument("root", type=Path, nargs="?", default=RECIPE_DIR, help="the built corpus")
    args = parser.parse_args(argv)
    try:
        folders = make_view(args.view, args.root, args.task)
    except FileNotFoundError as error:
        sys.exit(f"kaldi_view: {error}")
    for variable, folder in folders.items():
        print(f"export {variable}={shlex.quote(str(folder))}")


if __name__ == "__main__":
    main()
