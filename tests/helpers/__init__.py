"""What the tests share: the repository's paths, model and hardware builders, parsers of the exports, the screen
checks, and the workers the distributed tests start under torchrun."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
DATA = ROOT / "tests" / "data"
