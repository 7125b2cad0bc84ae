"""The candidate's process watches for run-time choosers (cuDNN's benchmark mode, TunableOp's
tuning) in the requests the reference worker marks: a chooser on, or turned on inside one, holds
the GPU's lease exclusive until the request ends (cudal1.harness.child.choosers)."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from cudal1.harness.child import choosers


@pytest.fixture
def watch(monkeypatch):
    """A Watch installed on this process's torch, undone after the test; its events in ``.events``.
    TunableOp's setters and states are stand-ins (a CPU build has none)."""
    tunable = {"enabled": False, "tuning": False}
    monkeypatch.setattr(torch._C, "_cuda_tunableop_enable", lambda v: tunable.update(enabled=bool(v)), raising=False)
    monkeypatch.setattr(torch._C, "_cuda_tunableop_tuning_enable", lambda v: tunable.update(tuning=bool(v)),
                        raising=False)
    monkeypatch.setattr(torch._C, "_cuda_tunableop_is_enabled", lambda: tunable["enabled"], raising=False)
    monkeypatch.setattr(torch._C, "_cuda_tunableop_tuning_is_enabled", lambda: tunable["tuning"], raising=False)
    monkeypatch.setattr(torch._C, "_set_cudnn_benchmark", torch._C._set_cudnn_benchmark)  # restored after
    prop = type(sys.modules["torch.backends.cudnn"]).__dict__["benchmark"]
    monkeypatch.setattr(prop, "setter", prop.setter)
    torch.backends.cudnn.benchmark = False
    events: list[bool] = []
    w = choosers.Watch(events.append)
    w.events = events
    assert w.install() == list(choosers.SETTERS)
    assert w.install() == []  # installing twice wraps nothing again
    yield w
    torch._C._set_cudnn_benchmark(False)


def test_a_chooser_on_at_the_start_of_a_watched_request_brackets_all_of_it(watch):
    torch.backends.cudnn.benchmark = True
    assert choosers.active() == ["cudnn_benchmark"]
    assert watch.events == []  # not inside a watched request: nothing goes out
    with watch.request(True):
        assert watch.events == [True]
        torch.backends.cudnn.benchmark = True  # on again inside: one bracket
    assert watch.events == [True, False]
    with watch.request(False):  # a request the reference worker does not watch
        pass
    with pytest.raises(RuntimeError, match="the call failed"):
        with watch.request(True):
            raise RuntimeError("the call failed")
    assert watch.events == [True, False, True, False]  # closed however the request ends


def test_a_chooser_turned_on_inside_a_watched_request_brackets_the_rest_of_it(watch):
    with watch.request(True):
        assert watch.events == []
        x = torch.ones(3)  # work before it stays under the phase's lease
        with torch.backends.cudnn.flags(enabled=True, benchmark=True):  # the builtin's cudnn-autotune pass
            assert watch.events == [True]
            x = x + 1
        assert not torch.backends.cudnn.benchmark and watch.events == [True]  # open to the request's end
        torch.backends.cudnn.benchmark = True
    assert watch.events == [True, False]
    torch.backends.cudnn.benchmark = False
    with watch.request(True):
        torch.cuda.tunable.enable(True)  # enabled without tuning: it reads its results, times nothing
        assert watch.events == [True, False]
        torch.cuda.tunable.tuning_enable(True)
        assert choosers.active() == ["tunableop"] and watch.events == [True, False, True]
    assert watch.events == [True, False, True, False]


def test_a_chooser_turned_on_off_the_main_thread_or_outside_a_watched_request_is_not_bracketed(watch):
    torch.backends.cudnn.benchmark = True  # outside a request
    torch.backends.cudnn.benchmark = False
    with watch.request(True):
        other = threading.Thread(target=lambda: setattr(torch.backends.cudnn, "benchmark", True))
        other.start()
        other.join()
        assert watch.events == []  # seen at the next watched request's start
    with watch.request(True):
        pass
    assert watch.events == [True, False]


def test_a_setting_this_torch_lacks_reads_as_off(monkeypatch):
    def missing():
        raise AttributeError("no TunableOp in this build")

    monkeypatch.setattr(torch._C, "_cuda_tunableop_is_enabled", missing, raising=False)
    torch._C._set_cudnn_benchmark(False)
    assert choosers.active() == []


def test_the_candidates_process_nests_its_alone_brackets_on_one_line():
    """A Triton autotuner's bracket inside a watched call's: only the outermost ends go out."""
    from cudal1.harness.child.worker import CandidateProcess

    process = CandidateProcess.__new__(CandidateProcess)
    process.alone_depth = 0
    sent: list[tuple[str, bool, bool]] = []
    process.lease_event = lambda event, on, drain: sent.append((event, on, drain))
    process.autotune_alone(True)  # the watch
    process.autotune_alone(True)  # an autotuner inside it
    process.autotune_alone(False)
    assert sent == [("autotune", True, False)]
    process.autotune_alone(False)
    assert sent == [("autotune", True, False), ("autotune", False, True)] and process.alone_depth == 0
