"""The harness Verilog is generated again exactly when a file it is generated from changes
(sim/harness.py ``source_digest``): any hw/ file edited, added or renamed."""
from sim import harness, runner


def test_digest_follows_every_hw_file(tmp_path, monkeypatch):
    hw = tmp_path / "hw" / "ndp"
    hw.mkdir(parents=True)
    (hw / "lookup.py").write_text("A = 1\n")
    monkeypatch.setattr(runner, "REPO", tmp_path)
    first = harness.source_digest()
    assert harness.source_digest() == first                 # stable
    (hw / "lookup.py").write_text("A = 2\n")
    edited = harness.source_digest()
    assert edited != first
    (hw / "update.py").write_text("")
    added = harness.source_digest()
    assert added not in (first, edited)
    (hw / "update.py").rename(hw / "update2.py")
    assert harness.source_digest() not in (first, edited, added)
