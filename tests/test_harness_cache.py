"""The harness Verilog is generated again exactly when a file it is generated from changes
(sim/harness.py ``source_digest``): any hw/ file edited, added or renamed."""
import pytest

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



def test_stamp_is_the_loaded_digest(tmp_path, monkeypatch):
    """The Verilog is stamped with the digest of the code this process imported, not of the
    files now: a process started before an edit must not stamp its old Verilog as current."""
    monkeypatch.setattr(runner, "BUILD", tmp_path)
    monkeypatch.setattr(harness, "source_digest", lambda: "edited-on-disk")
    monkeypatch.setattr(harness.verilog, "convert", lambda *a, **k: "// generated\n")
    monkeypatch.setattr(harness, "DeviceHarness", lambda config: object())
    monkeypatch.setattr(harness, "ports_control_file", lambda h: "")
    monkeypatch.setattr(runner, "build", lambda name, *a, **k: tmp_path / name)
    with pytest.warns(UserWarning, match="hw/ changed"):
        harness.build_harness(harness.DeviceConfig())
    (stamp,) = tmp_path.glob("sim/src/*/source.sha1")
    assert stamp.read_text() == harness.LOADED_DIGEST
