"""Generated documentation is up to date with its one source (hw/cxl_controller/csr_map.py)."""
from tools import docs


def test_register_docs_are_current():
    stale = docs.check()
    assert not stale, f"stale generated docs: {stale}; run `make regmap` and commit"
