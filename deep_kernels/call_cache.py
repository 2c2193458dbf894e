"""What the GEMM entry points keep between calls, so that a call like an earlier one costs a dictionary lookup or two
and its launch.

A call's checks fall in two parts. Those that depend on dtypes, shapes, strides and devices run once per call
signature (checked_call keeps what they returned). Those that depend on where the tensors lie (TMA's alignment, an
output over an input) run once per address set, when the launch for those addresses is prepared (Kernel.prepare);
the prepared launches are kept with the signature, by the addresses and plan they were made for
(jit.runtime.remember_launch bounds them).
"""

# Signatures of calls that passed validation -> (what their check returned, the prepared launches by address set).
_checked_calls = {}


def call_signature(*tensors) -> tuple:
    """What validation depends on, bar data addresses: dtypes, shapes, strides and devices (None stays None)."""
    return tuple([None if t is None else (t.dtype, t.shape, t.stride(), t.get_device()) for t in tensors])


def checked_call(check, tensors: tuple, *extra) -> tuple:
    """(check(*tensors, *extra), the signature's prepared launches): the check runs once per signature (the check,
    the tensors' call_signature and the extra values); a check that raises leaves nothing behind."""
    try:
        signature = (check, call_signature(*tensors), tuple((type(value), value) for value in extra))
    except AttributeError:  # not tensors: the full check says which
        signature = None
    checked = _checked_calls.get(signature)
    if checked is None:
        checked = (check(*tensors, *extra), {})
        if signature is not None:
            _checked_calls[signature] = checked
    return checked
