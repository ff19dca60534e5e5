"""The ``tensorboard`` tracker (``ebpo.trackers.tensorboard``): a writer never opens an events file that
TensorBoard would sort before an earlier one."""

from __future__ import annotations


def test_a_tensorboard_writer_opens_after_the_second_of_every_earlier_events_file(tmp_path):
    """TensorBoard reads events files by name (``<second>.<host>.<pid>.<n>``, so ``.10`` before ``.9``): a writer
    opened in the second of an earlier file waits until that second has passed."""
    import time

    from ebpo.trackers.tensorboard import _after_earlier_files

    now = int(time.time())
    (tmp_path / f"events.out.tfevents.{now + 1}.host.1.9").write_bytes(b"")
    _after_earlier_files(tmp_path)
    assert time.time() >= now + 2
