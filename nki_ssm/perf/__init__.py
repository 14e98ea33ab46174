"""Cost model: per-target engine timing over the simulator's instruction trace.

    perf.model(trace, target="trn2") -> Timing
    perf.model_range(trace, target="trn2") -> Timing with time_p10_ns / time_p90_ns (10-90 %)
                                              and time_low_ns / time_high_ns (extremes)
    perf.profile(kernel, *arrays, target="trn2") -> (outputs, Timing)
    perf.timeline_png(timing_or_trace, path)      # engine Gantt chart (matplotlib, lazy)

Every time is *modeled* for a named target, per NeuronCore.
"""
from nki_ssm.perf.hardware import CALIBRATED, SOURCES, TARGETS, HardwareSpec, get_target
from nki_ssm.perf.model import model, model_range
from nki_ssm.perf.profile import profile
from nki_ssm.perf.timing import Timing


def timeline_png(timing_or_trace, path, **kwargs):
    """Engine timeline (Gantt) of a Timing (or a trace, modeled on trn2) saved as a PNG."""
    from nki_ssm.perf.plots import timeline_png as _impl

    return _impl(timing_or_trace, path, **kwargs)


__all__ = ["model", "model_range", "profile", "timeline_png", "Timing", "HardwareSpec", "get_target",
           "TARGETS", "SOURCES", "CALIBRATED"]
