"""Triton kernels of the recurrences: each runs a whole sequence in one launch (the GPU backend of
:mod:`models.fast.triton_loops`, which loads this file and launches them; read that module first).

Two kinds of kernel:

* **Persistent recurrences with a matrix** (:func:`gated_forward`, :func:`gated_backward`,
  :func:`lbru_forward`). Program ``(p, q)`` owns the hidden units ``[p*BLOCK_H, (p+1)*BLOCK_H)`` of the
  batch rows ``[q*BLOCK_B, (q+1)*BLOCK_B)`` for the whole sequence. At each step it reads the full
  previous state of its rows (``B x H``, from global memory: the L2 cache), multiplies it by its own
  columns of every gate of the recurrent matrix, runs the unit's elementwise step on its own units,
  writes its slice of the new state, and waits at a barrier until every program of its rows has
  written theirs (:func:`_sync`). cuDNN's persistent RNN kernels work the same way; what the barrier
  costs (about a microsecond) replaces a kernel launch per step.
* **Elementwise recursions** (:func:`softplus_scan` ...): every unit of every sequence is independent,
  so each program takes a block of ``B*H`` and runs the time loop alone; no barrier.

The barrier needs every program of a launch resident at once. The launcher asks CUDA for that (a
cooperative launch, which CUDA refuses for a grid that cannot be co-resident) and sizes its grids from the
compiled kernel's occupancy; and a barrier never waits for ever: after ``SPINS`` polls it gives up, sets
``GAVE_UP`` in its counter (every later barrier of those rows then passes at once, so the launch ends,
with garbage) and returns. It never traps, which would poison the CUDA context; the host reads the
counters after the launch and reruns the pass on the TorchScript loop. With ``SYNC = False`` a launch
runs steps ``[t_begin, t_end)`` without the barrier, the kernel boundary being the barrier: that is how
Triton's CPU interpreter, which runs programs one after another, tests a grid of several programs, one
launch per step; with one program ``SYNC`` is harmless.

Layouts are time-major and contiguous: outputs ``(T, B, H)`` and ``h0`` ``(B, H)``, projections
``(T, B, G*H)``, the recurrent matrix transposed ``w_t`` ``(H, G*H)`` forward and as it is ``w``
``(G*H, H)`` backward.

This file is executed twice by :mod:`models.fast.triton_loops`, once with ``INTERPRET = True`` (CPU
tensors through Triton's interpreter) and once without; ``jit`` is the matching decorator. Long because
every kernel is in this one file: a kernel calls its helpers by their names in this file's globals, so
kernels and helpers must be executed together, in one copy for each decorator.
"""

import triton
import triton.language as tl

if globals().get("INTERPRET"):
    from triton.runtime.interpreter import InterpretedFunction as jit
else:
    jit = triton.jit

# Unit numbers of the gated family (KIND), the same names as models.fast.loops._GATED. Compiled kernels
# read only globals that are ``tl.constexpr``.
BRU, LIBRU, LIGRU, RNN_TANH, RNN_RELU, GRU, LSTM, MGU = (tl.constexpr(number) for number in range(8))


# --------------------------------------------------------------------------- elementwise helpers
@jit
def _log1p(y):
    """``log(1 + y)`` for ``y >= 0``, exact to rounding where ``1 + y`` rounds (Goldberg's trick)."""
    u = 1.0 + y
    exact = u == 1.0
    return tl.where(exact, y, tl.log(u) * (y / tl.where(exact, 1.0, u - 1.0)))


@jit
def _log_sigmoid(a):
    """``log sigma(a) = min(a, 0) - log(1 + exp(-|a|))``, finite for every finite ``a``."""
    return tl.minimum(a, 0.0) - _log1p(tl.exp(-tl.abs(a)))


@jit
def _sigmoid(a):
    # (tl.sigmoid is a jit function of Triton's own, which its interpreter does not run)
    e = tl.exp(-tl.abs(a))
    return tl.where(a >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@jit
def _softplus(a):
    return tl.maximum(a, 0.0) + _log1p(tl.exp(-tl.abs(a)))


@jit
def _tanh(a):
    """``tanh`` from one exponential of a non-positive number (no overflow)."""
    e = tl.exp(-2.0 * tl.abs(a))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(a < 0, -t, t)


# A barrier gives up after this many polls of its counter (each a round trip to the L2 cache, under a
# microsecond: seconds in all, where a step's wait is microseconds), and then sets GAVE_UP in the counter:
# above every target of a launch (the launcher keeps arrivals * steps below it).
SPINS = tl.constexpr(1 << 22)
GAVE_UP = tl.constexpr(1 << 30)


@jit
def _sync(counter, target, SYNC: tl.constexpr):
    """Wait until ``target`` arrivals at ``counter`` (every program of these rows has written this step):
    the writes before it are seen by every program after it. ``debug_barrier`` makes the program's own
    threads' stores precede its release; the acquiring read orders the program's later loads after the
    others' released stores, and the block barrier after it extends that to all of its threads. (The
    loads of the state ask for ``.cg``, past the L1 cache, which is not coherent between multiprocessors;
    that is a hint: for H = 550 the compiler copies the state to shared memory 4 bytes at a time, for which
    ``cp.async`` has no ``.cg``, and the copies cache in L1 (``.ca``, read in the PTX). The acquire and the
    barrier are what make the loads right.) After ``SPINS`` polls it gives up: ``GAVE_UP`` OR-ed into the counter (idempotent, so
    that several programs giving up at once cannot overflow it) lets every program through."""
    if SYNC:
        tl.debug_barrier()
        tl.atomic_add(counter, 1, sem="release", scope="gpu")
        arrived = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
        polls = 0
        while arrived < target:
            polls += 1
            if polls == SPINS:
                tl.atomic_or(counter, GAVE_UP, sem="relaxed", scope="gpu")
            arrived = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()


@jit
def _block(row0, B, H, counters, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, TWO_BARRIERS: tl.constexpr):
    """This program's batch rows and hidden units (axis 1 and 0 of the grid), which of them exist, the
    counter of its block of rows' barrier, and the arrivals there per step (two barriers a step, or one)."""
    rows = row0 + tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    units = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    arrivals = tl.num_programs(0)
    if TWO_BARRIERS:
        arrivals = arrivals * 2
    return rows, units, rows < B, units < H, counters + tl.program_id(1), arrivals


@jit
def _previous(out, h0, t, BH):
    """Where ``h_{t-1}`` is: step ``t - 1``'s output, or ``h0``."""
    previous = h0
    if t > 0:
        previous = out + (t - 1) * BH
    return previous


@jit
def _load(ptr, rows, row_ok, cols, col_ok, ld):
    """The block ``[rows, cols]`` of a row-major matrix with leading dimension ``ld`` (0 outside)."""
    return tl.load(ptr + rows[:, None] * ld + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)


@jit
def _store(ptr, value, rows, row_ok, cols, col_ok, ld):
    tl.store(ptr + rows[:, None] * ld + cols[None, :], value, mask=row_ok[:, None] & col_ok[None, :])


@jit
def _product(acc, a_ptr, a_ld, rows, row_ok, b_ptr, b_ld, cols, col_ok, k_count, BLOCK_K: tl.constexpr):
    """``acc + A[rows, :k_count] @ B[:k_count, cols]`` (row-major, leading dimensions ``a_ld``, ``b_ld``); ``A``
    is another program's output of this step, read at L2 (``.cg``)."""
    for k0 in range(0, k_count, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_count
        a = tl.load(a_ptr + rows[:, None] * a_ld + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0,
                    cache_modifier=".cg")
        b = tl.load(b_ptr + ks[:, None] * b_ld + cols[None, :], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc += tl.dot(a, b, input_precision="ieee", out_dtype=acc.dtype)
    return acc


@jit
def _gate_products(a0, a1, a2, a3, previous, rows, row_ok, w_t, GH, units, unit_ok, H, G: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """``a_g + h_{t-1} U_g^T`` on the own units of each of the first ``G`` (at most 4) gates, whose columns of
    ``w_t`` ``(H, G*H)`` start at ``g*H``; ``h_{t-1}`` (``previous``, the other programs' output) is read
    once, at L2. The accumulators past ``G`` come back unchanged."""
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < H
        hk = tl.load(previous + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0,
                     cache_modifier=".cg")
        w_block = w_t + ks[:, None] * GH + units[None, :]
        w_ok = k_ok[:, None] & unit_ok[None, :]
        a0 += tl.dot(hk, tl.load(w_block, mask=w_ok, other=0.0), input_precision="ieee", out_dtype=a0.dtype)
        if G > 1:
            a1 += tl.dot(hk, tl.load(w_block + H, mask=w_ok, other=0.0), input_precision="ieee", out_dtype=a1.dtype)
        if G > 2:
            a2 += tl.dot(hk, tl.load(w_block + 2 * H, mask=w_ok, other=0.0), input_precision="ieee",
                         out_dtype=a2.dtype)
        if G > 3:
            a3 += tl.dot(hk, tl.load(w_block + 3 * H, mask=w_ok, other=0.0), input_precision="ieee",
                         out_dtype=a3.dtype)
    return a0, a1, a2, a3


# --------------------------------------------------------------------------- the gated family, forward
@jit
def gated_forward(proj, w_t, bias, h0, out, mask, keep1, keep2, scratch, counters, T, B, H, row0, t_begin, t_end,
                  KIND: tl.constexpr, G: tl.constexpr, TRAIN: tl.constexpr, HAS_MASK: tl.constexpr,
                  SYNC: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    """Steps ``[t_begin, t_end)`` of unit ``KIND`` (``G`` gates) from ``h0``, writing ``out[t]`` and with ``TRAIN``
    what :mod:`models.fast.loops` keeps for backward, in the same layout:

    ========  ===========================================  ===============================
    unit      ``keep1[t]``                                 ``keep2[t]``
    ========  ===========================================  ===============================
    libru     ``[log z, log h~]`` ``(B, 2H)``               ``log h_{t-1} - a_z`` ``(B, H)``
    ligru     the pre-activations ``[a_z, a_h]``
    gru       ``[r, z, n]`` (``n`` undropped)               ``U h_{t-1} + b_hh`` ``(B, 3H)``
    lstm      ``[i, f, g, o]`` (``g`` undropped)            ``c_t`` ``(B, H)``
    mgu       ``[f, h~]``
    ========  ===========================================  ===============================

    ``bias`` is ``b_hh`` (GRU only; the LSTM's is in ``proj``), ``mask`` the candidate mask ``(B, H)``
    (``HAS_MASK``), ``scratch`` ``(2, B, H)`` the MGU's ``f h_{t-1}``, shared between programs.
    """
    rows, units, row_ok, unit_ok, counter, arrivals = _block(row0, B, H, counters, BLOCK_B, BLOCK_H, KIND == MGU)
    GH = G * H
    h = _load(_previous(out, h0, t_begin, B * H), rows, row_ok, units, unit_ok, H)  # own units of h_{t-1}
    if HAS_MASK:
        m = _load(mask, rows, row_ok, units, unit_ok, H)
    if KIND == LSTM:
        c = tl.full((BLOCK_B, BLOCK_H), 0.0, dtype=h.dtype)
        if t_begin > 0:
            c = _load(keep2 + (t_begin - 1) * B * H, rows, row_ok, units, unit_ok, H)
    for t in range(t_begin, t_end):
        previous = _previous(out, h0, t, B * H)
        p_t = proj + t * B * GH
        step = t - t_begin
        if KIND == MGU:  # f = sigma(p_f + U_f h), then h~ = tanh(p_h + U_h (f h)): two products, two barriers
            a_f = _product(_load(p_t, rows, row_ok, units, unit_ok, GH), previous, H, rows, row_ok, w_t, GH,
                           units, unit_ok, H, BLOCK_K)
            f = _sigmoid(a_f)
            _store(scratch + (t % 2) * B * H, f * h, rows, row_ok, units, unit_ok, H)
            _sync(counter, arrivals * step + arrivals // 2, SYNC)
            a_h = _product(_load(p_t + H, rows, row_ok, units, unit_ok, GH), scratch + (t % 2) * B * H, H, rows,
                           row_ok, w_t + H, GH, units, unit_ok, H, BLOCK_K)
            candidate = _tanh(a_h)
            h = h + f * (candidate - h)
            if TRAIN:
                _store(keep1 + t * B * GH, f, rows, row_ok, units, unit_ok, GH)
                _store(keep1 + t * B * GH + H, candidate, rows, row_ok, units, unit_ok, GH)
        else:
            # The pre-activations of the own units of every gate: p + h_{t-1} U^T, h_{t-1} read once.
            a0 = _load(p_t, rows, row_ok, units, unit_ok, GH)
            a1, a2, a3 = a0, a0, a0  # (the gates past G are not used)
            if G > 1:
                a1 = _load(p_t + H, rows, row_ok, units, unit_ok, GH)
            if G > 2:
                a2 = _load(p_t + 2 * H, rows, row_ok, units, unit_ok, GH)
            if G > 3:
                a3 = _load(p_t + 3 * H, rows, row_ok, units, unit_ok, GH)
            if KIND == GRU:  # the reset gate multiplies U_n h + b_hn: keep the hidden part apart
                zero = tl.full((BLOCK_B, BLOCK_H), 0.0, dtype=h.dtype)
                u0 = zero + tl.load(bias + units, mask=unit_ok, other=0.0)[None, :]
                u1 = zero + tl.load(bias + H + units, mask=unit_ok, other=0.0)[None, :]
                u2 = zero + tl.load(bias + 2 * H + units, mask=unit_ok, other=0.0)[None, :]
                u0, u1, u2, u3 = _gate_products(u0, u1, u2, u2, previous, rows, row_ok, w_t, GH, units, unit_ok, H, 3,
                                                BLOCK_K)
            else:
                a0, a1, a2, a3 = _gate_products(a0, a1, a2, a3, previous, rows, row_ok, w_t, GH, units, unit_ok, H, G,
                                                BLOCK_K)
            if KIND == BRU:  # log h_t = log sigma(a_t)
                h = _log_sigmoid(a0)
            elif KIND == LIBRU:  # log h_t = log z + logaddexp(log h~, log h_{t-1} - a_z), as log(1 - z) = log z - a_z
                log_z, log_c, diff = _log_sigmoid(a0), _log_sigmoid(a1), h - a0
                top = tl.maximum(log_c, diff)
                h = log_z + top + _log1p(tl.exp(-tl.abs(log_c - diff)))
                if TRAIN:
                    _store(keep1 + t * B * GH, log_z, rows, row_ok, units, unit_ok, GH)
                    _store(keep1 + t * B * GH + H, log_c, rows, row_ok, units, unit_ok, GH)
                    _store(keep2 + t * B * H, diff, rows, row_ok, units, unit_ok, H)
            elif KIND == LIGRU:  # h_t = h_{t-1} + z (m relu(a_h) - h_{t-1})
                candidate = tl.maximum(a1, 0.0)
                if HAS_MASK:
                    candidate = candidate * m
                h = h + _sigmoid(a0) * (candidate - h)
                if TRAIN:
                    _store(keep1 + t * B * GH, a0, rows, row_ok, units, unit_ok, GH)
                    _store(keep1 + t * B * GH + H, a1, rows, row_ok, units, unit_ok, GH)
            elif KIND == RNN_TANH or KIND == RNN_RELU:
                if KIND == RNN_TANH:
                    h = _tanh(a0)
                else:
                    h = tl.maximum(a0, 0.0)
                if HAS_MASK:
                    h = h * m
            elif KIND == GRU:  # n = tanh(p_n + r (U_n h + b_hn)), h_t = m n + z (h_{t-1} - m n)
                r, z = _sigmoid(a0 + u0), _sigmoid(a1 + u1)
                n = _tanh(a2 + r * u2)
                dropped = n
                if HAS_MASK:
                    dropped = n * m
                h = dropped + z * (h - dropped)
                if TRAIN:
                    kept = keep1 + t * B * GH
                    _store(kept, r, rows, row_ok, units, unit_ok, GH)
                    _store(kept + H, z, rows, row_ok, units, unit_ok, GH)
                    _store(kept + 2 * H, n, rows, row_ok, units, unit_ok, GH)
                    hidden = keep2 + t * B * GH
                    _store(hidden, u0, rows, row_ok, units, unit_ok, GH)
                    _store(hidden + H, u1, rows, row_ok, units, unit_ok, GH)
                    _store(hidden + 2 * H, u2, rows, row_ok, units, unit_ok, GH)
            elif KIND == LSTM:  # c_t = f c_{t-1} + i m g, h_t = o tanh(c_t)
                i, f, g, o = _sigmoid(a0), _sigmoid(a1), _tanh(a2), _sigmoid(a3)
                candidate = g
                if HAS_MASK:
                    candidate = g * m
                c = f * c + i * candidate
                h = o * _tanh(c)
                if TRAIN:
                    kept = keep1 + t * B * GH
                    _store(kept, i, rows, row_ok, units, unit_ok, GH)
                    _store(kept + H, f, rows, row_ok, units, unit_ok, GH)
                    _store(kept + 2 * H, g, rows, row_ok, units, unit_ok, GH)
                    _store(kept + 3 * H, o, rows, row_ok, units, unit_ok, GH)
                    _store(keep2 + t * B * H, c, rows, row_ok, units, unit_ok, H)
        _store(out + t * B * H, h, rows, row_ok, units, unit_ok, H)
        _sync(counter, arrivals * (step + 1), SYNC)


# --------------------------------------------------------------------------- the gated family, backward
@jit
def gated_backward(K, C, A, F, grad_out, w, da, g_state, dc_state, scratch, counters, T, B, H, row0, t_begin,
                   t_end, KIND: tl.constexpr, G: tl.constexpr, GK: tl.constexpr, HAS_C: tl.constexpr,
                   SYNC: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    """The sequential part of a gated unit's backward pass, steps ``t_end - 1`` down to ``t_begin``.

    ``g_t = dL/dh_t`` with everything from ``t + 1`` on included. For the units of
    :func:`models.fast.loops._gated_backward` (all but the LSTM and the MGU), whose gate gradients are linear
    in ``g``: ``da_t = K_t g_t`` (``GK`` gates) and ``g_t = grad_out_t + C_{t+1} g_{t+1} + da_{t+1}[:, :G*H] @ w``.
    The LSTM (``KIND == LSTM``) carries ``dc`` (``dc_state``): ``dc += g_t A_t``,
    ``da_t = [K_i dc, K_f dc, K_g dc, K_o g_t]``, ``dc <- dc F_t`` (``F`` the forget gate). Each step forms
    ``g_t`` from the other programs' ``da_{t+1}``, writes its units of ``da_t`` and meets them at the barrier,
    so that a launch per step (the interpreter) keeps the order; ``g_state`` carries ``g_{t_end}`` in and
    ``g_{t_begin}`` out, and after step 0 the last product, ``dL/dh_0 = C_0 g_0 + da_0 @ w``, replaces it
    (without the barrier: in a launch of no steps of its own, ``t_begin = t_end = 0``).

    The MGU (``KIND == MGU``, ``K = [K_f, K_h, K_s]``, ``F = f``; its programs always run together) per step:
    ``da_h = K_h g``, barrier, ``ds = da_h @ U_h``, ``da_f = K_f g + K_s ds``, barrier,
    ``g <- grad_out_{t-1} + C g + F ds + da_f @ U_f``, with ``g_state`` carrying ``g`` in and out.
    """
    rows, units, row_ok, unit_ok, counter, arrivals = _block(row0, B, H, counters, BLOCK_B, BLOCK_H, KIND == MGU)
    GKH = GK * H
    g = _load(g_state, rows, row_ok, units, unit_ok, H)
    if KIND == LSTM:
        dc = _load(dc_state, rows, row_ok, units, unit_ok, H)
    for step in range(0, t_end - t_begin):
        t = t_end - 1 - step
        k_t, da_t = K + t * B * GKH, da + t * B * GKH
        if KIND == MGU:
            following = tl.full((BLOCK_B, BLOCK_H), 0.0, dtype=g.dtype)
            if t > 0:
                following = _load(grad_out + (t - 1) * B * H, rows, row_ok, units, unit_ok, H)
            following += _load(C + t * B * H, rows, row_ok, units, unit_ok, H) * g
            _store(da_t + H, _load(k_t + H, rows, row_ok, units, unit_ok, GKH) * g, rows, row_ok, units, unit_ok,
                   GKH)
            _sync(counter, arrivals * step + arrivals // 2, SYNC)
            ds = _product(tl.full((BLOCK_B, BLOCK_H), 0.0, dtype=g.dtype), da_t + H, GKH, rows, row_ok, w + H * H,
                          H, units, unit_ok, H, BLOCK_K)
            da_f = (_load(k_t, rows, row_ok, units, unit_ok, GKH) * g
                    + _load(k_t + 2 * H, rows, row_ok, units, unit_ok, GKH) * ds)
            _store(da_t, da_f, rows, row_ok, units, unit_ok, GKH)
            following += _load(F + t * B * H, rows, row_ok, units, unit_ok, H) * ds
            _sync(counter, arrivals * (step + 1), SYNC)
            g = _product(following, da_t, GKH, rows, row_ok, w, H, units, unit_ok, H, BLOCK_K)
        else:
            if t < T - 1:  # g_t from g_{t+1} and every program's da_{t+1}
                following = _load(grad_out + t * B * H, rows, row_ok, units, unit_ok, H)
                if HAS_C:
                    following += _load(C + (t + 1) * B * H, rows, row_ok, units, unit_ok, H) * g
                g = _product(following, da_t + B * GKH, GKH, rows, row_ok, w, H, units, unit_ok, G * H, BLOCK_K)
            if KIND == LSTM:
                dc += g * _load(A + t * B * H, rows, row_ok, units, unit_ok, H)
                for gate in range(0, 3):
                    _store(da_t + gate * H, _load(k_t + gate * H, rows, row_ok, units, unit_ok, GKH) * dc, rows,
                           row_ok, units, unit_ok, GKH)
                _store(da_t + 3 * H, _load(k_t + 3 * H, rows, row_ok, units, unit_ok, GKH) * g, rows, row_ok, units,
                       unit_ok, GKH)
                dc = dc * _load(F + t * B * H, rows, row_ok, units, unit_ok, H)
            else:
                for gate in range(0, GK):
                    _store(da_t + gate * H, _load(k_t + gate * H, rows, row_ok, units, unit_ok, GKH) * g, rows,
                           row_ok, units, unit_ok, GKH)
            _sync(counter, arrivals * (step + 1), SYNC)
    if KIND != MGU:
        if t_begin == 0 and (SYNC or t_end == 0):  # dL/dh_0
            following = tl.full((BLOCK_B, BLOCK_H), 0.0, dtype=g.dtype)
            if HAS_C:
                following = _load(C, rows, row_ok, units, unit_ok, H) * g
            g = _product(following, da, GKH, rows, row_ok, w, H, units, unit_ok, G * H, BLOCK_K)
    _store(g_state, g, rows, row_ok, units, unit_ok, H)
    if KIND == LSTM:
        _store(dc_state, dc, rows, row_ok, units, unit_ok, H)


# --------------------------------------------------------------------------- the layer-wise BRU
@jit
def lbru_forward(proj, w_t, bias, h0, out, s_out, keep, hidden, counters, T, B, H, row0, t_begin, t_end,
                 G: tl.constexpr, INPUT_GATE: tl.constexpr, TRAIN: tl.constexpr, SYNC: tl.constexpr,
                 BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    """TPAMI eq. 72-75 (77), as :func:`models.fast.loops._lbru_loop`: gates ``[z, r, n(, s)]``, ``u = U h_{t-1}``,
    ``q = p_n + z_{t-1} (u_n + b)``, ``h_t = n + r (h_{t-1} - n)`` (``n`` without the input gate). With ``TRAIN``
    it keeps ``hidden[t] = u_n + b`` and ``keep[t]`` = the pre-activations ``[a_z, a_r, q(, a_s)]``, or
    ``[a_z, q(, a_s)]`` without the input gate."""
    rows, units, row_ok, unit_ok, counter, arrivals = _block(row0, B, H, counters, BLOCK_B, BLOCK_H, False)
    GH = G * H
    KW = GH  # the kept width: [a_z, a_r, q(, a_s)], or without a_r
    if not INPUT_GATE:
        KW = GH - H
    b_n = tl.load(bias + units, mask=unit_ok, other=0.0)[None, :]
    if t_begin > 0:  # a launch per step: the state from the last one's output (TRAIN)
        h = _load(out + (t_begin - 1) * B * H, rows, row_ok, units, unit_ok, H)
        z_previous = _sigmoid(_load(keep + (t_begin - 1) * B * KW, rows, row_ok, units, unit_ok, KW))
    else:
        h = _load(h0, rows, row_ok, units, unit_ok, H)
        z_previous = tl.full((BLOCK_B, BLOCK_H), 0.0, dtype=h.dtype)
    for t in range(t_begin, t_end):
        previous = _previous(out, h0, t, B * H)
        p_t = proj + t * B * GH
        a_z = _load(p_t, rows, row_ok, units, unit_ok, GH)
        a_r = _load(p_t + H, rows, row_ok, units, unit_ok, GH)
        u_n = tl.full((BLOCK_B, BLOCK_H), 0.0, dtype=h.dtype) + b_n
        a_s = a_z  # (no s gate unless G = 4)
        if G > 3:
            a_s = _load(p_t + 3 * H, rows, row_ok, units, unit_ok, GH)
        a_z, a_r, u_n, a_s = _gate_products(a_z, a_r, u_n, a_s, previous, rows, row_ok, w_t, GH, units, unit_ok, H, G,
                                            BLOCK_K)
        a_n = _load(p_t + 2 * H, rows, row_ok, units, unit_ok, GH) + z_previous * u_n  # (74)
        z, n = _sigmoid(a_z), _sigmoid(a_n)
        if INPUT_GATE:
            h = n + _sigmoid(a_r) * (h - n)  # (75)
        else:
            h = n  # (36)
        if G > 3:
            _store(s_out + t * B * H, _sigmoid(a_s), rows, row_ok, units, unit_ok, H)
        if TRAIN:
            kept = keep + t * B * KW
            _store(kept, a_z, rows, row_ok, units, unit_ok, KW)
            if INPUT_GATE:
                _store(kept + H, a_r, rows, row_ok, units, unit_ok, KW)
                kept += H
            _store(kept + H, a_n, rows, row_ok, units, unit_ok, KW)
            if G > 3:
                _store(kept + 2 * H, a_s, rows, row_ok, units, unit_ok, KW)
            _store(hidden + t * B * H, u_n, rows, row_ok, units, unit_ok, H)
        z_previous = z
        _store(out + t * B * H, h, rows, row_ok, units, unit_ok, H)
        _sync(counter, arrivals * (t - t_begin + 1), SYNC)


@jit
def lbru_backward(P, M, C, grad_h, w, du, G_out, g_state, counters, T, B, H, row0, t_begin, t_end,
                  G: tl.constexpr, SYNC: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """:func:`models.fast.loops._lbru_backward`, steps ``t_end - 1`` down to ``t_begin``, in the order of
    :func:`gated_backward`: ``G_out[t] = g_t = grad_h_t + C_{t+1} g_{t+1} + du_{t+1} @ w`` (``grad_h_{T-1}`` at the
    last frame), then this program's units of ``du_z[t] = g_{t+1} M_t`` (0 at the last frame) and
    ``[du_r, du_n][t] = g_t P_t`` (``P`` ``(T, B, 2, H)``; ``du`` ``(T, B, G*H)``, its ``s`` slot filled by the
    caller), then the barrier. ``g_state`` carries ``g_{t_end}`` in and ``g_{t_begin}`` out, and
    ``dL/dh_0 = C_0 g_0 + du_0 @ w`` after step 0."""
    rows, units, row_ok, unit_ok, counter, arrivals = _block(row0, B, H, counters, BLOCK_B, BLOCK_H, False)
    GH = G * H
    g = _load(g_state, rows, row_ok, units, unit_ok, H)
    for step in range(0, t_end - t_begin):
        t = t_end - 1 - step
        du_t = du + t * B * GH
        g_next = g
        if t < T - 1:
            following = (_load(grad_h + t * B * H, rows, row_ok, units, unit_ok, H)
                         + _load(C + (t + 1) * B * H, rows, row_ok, units, unit_ok, H) * g)
            g = _product(following, du_t + B * GH, GH, rows, row_ok, w, H, units, unit_ok, GH, BLOCK_K)
        else:
            g_next = g * 0.0
        _store(G_out + t * B * H, g, rows, row_ok, units, unit_ok, H)
        _store(du_t, g_next * _load(M + t * B * H, rows, row_ok, units, unit_ok, H), rows, row_ok, units, unit_ok,
               GH)
        _store(du_t + H, g * _load(P + t * B * 2 * H, rows, row_ok, units, unit_ok, 2 * H), rows, row_ok, units,
               unit_ok, GH)
        _store(du_t + 2 * H, g * _load(P + t * B * 2 * H + H, rows, row_ok, units, unit_ok, 2 * H), rows, row_ok,
               units, unit_ok, GH)
        _sync(counter, arrivals * (step + 1), SYNC)
    if t_begin == 0 and (SYNC or t_end == 0):  # dL/dh_0
        g = _product(_load(C, rows, row_ok, units, unit_ok, H) * g, du, GH, rows, row_ok, w, H, units, unit_ok, GH,
                     BLOCK_K)
    _store(g_state, g, rows, row_ok, units, unit_ok, H)


# --------------------------------------------------------------------------- elementwise recursions
@jit
def _scan_block(k, N, W, BLOCK: tl.constexpr):
    """This program's block of the ``N = B*W`` units of a ``(T, B, W)`` recursion, which ones exist, and each
    one's constants ``k_0``, ``k_1`` (``k`` ``(2, W)``)."""
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = n < N
    unit = n % W
    return n, ok, tl.load(k + unit, mask=ok, other=0.0), tl.load(k + W + unit, mask=ok, other=0.0)


@jit
def softplus_scan(c, k, x0, x, N, T, W, REVERSE: tl.constexpr, BLOCK: tl.constexpr):
    """``x_t = c_t + softplus(x_{t-1} + k_0) - softplus(x_{t-1} + k_1)`` from ``x0`` (``REVERSE``: from ``t + 1``),
    each program a block of the ``N = B*W`` units; ``c``, ``x`` ``(T, B, W)``, ``k`` ``(2, W)``, ``x0`` ``(B, W)``."""
    n, ok, k0, k1 = _scan_block(k, N, W, BLOCK)
    v = tl.load(x0 + n, mask=ok, other=0.0)
    for i in range(0, T):
        if REVERSE:
            t = T - 1 - i
        else:
            t = i
        v = tl.load(c + t * N + n, mask=ok, other=0.0) + _softplus(v + k0) - _softplus(v + k1)
        tl.store(x + t * N + n, v, mask=ok)


@jit
def softplus_scan_backward(grad, k, x0, x, G, grad_k, grad_x0, N, T, W, REVERSE: tl.constexpr,
                           BLOCK: tl.constexpr):
    """The gradient of :func:`softplus_scan` (as the C++ kernel's): with ``S_j = sigma(x_{t-1} + k_j)``,
    ``G_t = grad_t + (S_0 - S_1)_{t+1} G_{t+1}`` is ``dL/dc_t``, ``grad_k`` ``(2, B, W)`` gets ``+-sum_t S_j G_t``
    per unit (summed over ``B`` by the caller), ``grad_x0 = (S_0 - S_1)_0 G_0``."""
    n, ok, k0, k1 = _scan_block(k, N, W, BLOCK)
    carried = tl.load(grad + n, mask=ok, other=0.0) * 0.0
    sum0 = carried
    sum1 = carried
    for i in range(0, T):
        if REVERSE:  # the i-th frame of the recursion, counted from its end
            t, before = i, i + 1
        else:
            t, before = T - 1 - i, T - 2 - i
        g = tl.load(grad + t * N + n, mask=ok, other=0.0) + carried
        tl.store(G + t * N + n, g, mask=ok)
        if i < T - 1:
            v = tl.load(x + before * N + n, mask=ok, other=0.0)
        else:
            v = tl.load(x0 + n, mask=ok, other=0.0)
        s0, s1 = _sigmoid(v + k0), _sigmoid(v + k1)
        sum0 += s0 * g
        sum1 -= s1 * g
        carried = (s0 - s1) * g
    tl.store(grad_k + n, sum0, mask=ok)
    tl.store(grad_k + N + n, sum1, mask=ok)
    tl.store(grad_x0 + n, carried, mask=ok)


@jit
def kalman_smoother(x, k, last, gamma, N, T, H, BLOCK: tl.constexpr):
    """``gamma_t = (S_0 - S_1) gamma_{t+1} + S_1``, ``S_j = sigma(x_t + k_j)``, before each sequence's last frame
    ``last[b]``, and ``sigma(x_t)`` from it on (UBRU eq. 21, as the C++ kernel's)."""
    n, ok, k0, k1 = _scan_block(k, N, H, BLOCK)
    end = tl.load(last + n // H, mask=ok, other=0)  # each sequence's last frame
    following = k0 * 0.0
    for i in range(0, T):
        t = T - 1 - i
        v = tl.load(x + t * N + n, mask=ok, other=0.0)
        s0, s1 = _sigmoid(v + k0), _sigmoid(v + k1)
        following = tl.where(t >= end, _sigmoid(v), (s0 - s1) * following + s1)
        tl.store(gamma + t * N + n, following, mask=ok)


@jit
def kalman_smoother_backward(grad, x, k, last, gamma, grad_x, grad_k, N, T, H, BLOCK: tl.constexpr):
    """The gradient of :func:`kalman_smoother`: forward in time, ``G_t = grad_t + A_{t-1} G_{t-1}`` (``A = S_0 - S_1``,
    0 from the last frame on), ``dL/dA_t = G_t gamma_{t+1}``, ``dL/dS_1 = G_t - dL/dA_t``, through ``sigma'`` to ``x``
    and ``k`` (``grad_k`` ``(2, B, H)``, summed over ``B`` by the caller)."""
    n, ok, k0, k1 = _scan_block(k, N, H, BLOCK)
    end = tl.load(last + n // H, mask=ok, other=0)  # each sequence's last frame
    carried = k0 * 0.0
    sum0 = carried
    sum1 = carried
    for t in range(0, T):
        v = tl.load(x + t * N + n, mask=ok, other=0.0)
        g = tl.load(grad + t * N + n, mask=ok, other=0.0) + carried
        inside = t < end
        s = _sigmoid(v)
        s0, s1 = _sigmoid(v + k0), _sigmoid(v + k1)
        if t < T - 1:
            gamma_next = tl.load(gamma + (t + 1) * N + n, mask=ok & inside, other=0.0)
        else:
            gamma_next = carried * 0.0
        dA = g * gamma_next
        d0, d1 = dA * s0 * (1.0 - s0), (g - dA) * s1 * (1.0 - s1)
        tl.store(grad_x + t * N + n, tl.where(inside, d0 + d1, g * s * (1.0 - s)), mask=ok)
        sum0 += tl.where(inside, d0, 0.0)
        sum1 += tl.where(inside, d1, 0.0)
        carried = tl.where(inside, (s0 - s1) * g, 0.0)
    tl.store(grad_k + n, sum0, mask=ok)
    tl.store(grad_k + N + n, sum1, mask=ok)


# The value the HMM pass's r takes after a sequence's end (models.fast.scans._NO_FUTURE): softplus(r + j) is 0.
NO_FUTURE = tl.constexpr(-1e30)


@jit
def hmm_smoother(x, a, j, c, last, gamma, r_out, N, T, H, BLOCK: tl.constexpr):
    """The UBRU's HMM backward pass and its posteriors in one kernel (UBRU eq. 17-18, see
    :func:`models.fast.paths._hmm_inputs`): backwards in time, ``r_t = a_t`` at each sequence's last frame
    ``last[b]``, ``r_t = a_t + c + softplus(r_{t+1} + j_0) - softplus(r_{t+1} + j_1)`` before it and
    ``NO_FUTURE`` after it, then ``gamma_t = sigma(x_t + r_t - a_t)`` (``x`` logit alpha). ``x``, ``a``,
    ``gamma``, ``r_out`` ``(T, B, H)``, ``j`` ``(2, H)``, ``c`` ``(H,)``; ``r`` is kept for the backward pass."""
    n, ok, j0, j1 = _scan_block(j, N, H, BLOCK)
    c_n = tl.load(c + n % H, mask=ok, other=0.0)
    end = tl.load(last + n // H, mask=ok, other=0)  # each sequence's last frame
    r = j0 * 0.0
    for i in range(0, T):
        t = T - 1 - i
        a_t = tl.load(a + t * N + n, mask=ok, other=0.0)
        r = tl.where(t == end, a_t, a_t + c_n + _softplus(r + j0) - _softplus(r + j1))
        r = tl.where(t > end, NO_FUTURE, r)
        tl.store(r_out + t * N + n, r, mask=ok)
        tl.store(gamma + t * N + n, _sigmoid(tl.load(x + t * N + n, mask=ok, other=0.0) + r - a_t), mask=ok)


@jit
def hmm_smoother_backward(grad, j, last, gamma, r, grad_x, grad_a, grad_jc, N, T, H, BLOCK: tl.constexpr):
    """The gradient of :func:`hmm_smoother`, forwards in time. With ``d_t = grad_t gamma_t (1 - gamma_t)`` (the
    gradient of ``x_t``), ``R_t = dL/dr_t`` is ``d_t + (S_0 - S_1) R_{t-1}`` up to the last frame (``S_k =
    sigma(r_t + j_k)``: ``r_{t-1}`` depends on ``r_t``), 0 after it; ``dL/da_t = R_t - d_t``; ``grad_jc``
    ``(3, B, H)`` gets ``sum R_{t-1} S_0``, ``-sum R_{t-1} S_1`` and ``sum R_{t-1}`` over the frames before the
    last (summed over ``B`` by the caller)."""
    n, ok, j0, j1 = _scan_block(j, N, H, BLOCK)
    end = tl.load(last + n // H, mask=ok, other=0)
    carried = j0 * 0.0  # R_{t-1}
    sum0 = carried
    sum1 = carried
    sum_c = carried
    for t in range(0, T):
        g = tl.load(gamma + t * N + n, mask=ok, other=0.0)
        d = tl.load(grad + t * N + n, mask=ok, other=0.0) * g * (1.0 - g)
        inside = t <= end
        if t > 0:  # r_{t-1} = a_{t-1} + c + softplus(r_t + j_0) - softplus(r_t + j_1) (t - 1 < end)
            v = tl.load(r + t * N + n, mask=ok, other=0.0)
            s0, s1 = _sigmoid(v + j0), _sigmoid(v + j1)
            carried = tl.where(inside, carried, 0.0)
            sum0 += carried * s0
            sum1 -= carried * s1
            sum_c += carried
            following = d + (s0 - s1) * carried
        else:
            following = d
        carried = tl.where(inside, following, 0.0)
        tl.store(grad_x + t * N + n, d, mask=ok)
        tl.store(grad_a + t * N + n, carried - d, mask=ok)
    tl.store(grad_jc + n, sum0, mask=ok)
    tl.store(grad_jc + N + n, sum1, mask=ok)
    tl.store(grad_jc + 2 * N + n, sum_c, mask=ok)


# --------------------------------------------------------------------------- the layer-wise smoothing
@jit
def matrix_forward(A, h, w_t, bias, y, lin, counters, T, B, H, row0, t_begin, t_end, SYNC: tl.constexpr,
                   BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    """TPAMI eq. 78 as :func:`models.fast.scans._matrix_loop`, backwards in time, steps ``t_end - 1`` down to
    ``t_begin``: ``lin_t = W y_{t+1} + b`` (``b`` at the last frame, ``y_T = 0``), ``y_t = h_t + A_t (lin_t - h_t)``;
    ``A``, ``h``, ``y``, ``lin`` ``(T, B, H)``, ``w_t`` the matrix transposed."""
    rows, units, row_ok, unit_ok, counter, arrivals = _block(row0, B, H, counters, BLOCK_B, BLOCK_H, False)
    bias_row = tl.load(bias + units, mask=unit_ok, other=0.0)[None, :]
    for step in range(0, t_end - t_begin):
        t = t_end - 1 - step
        here = t * B * H
        h_t = _load(h + here, rows, row_ok, units, unit_ok, H)
        linear = h_t * 0.0 + bias_row
        if t < T - 1:  # every program's y_{t+1}
            linear = _product(linear, y + here + B * H, H, rows, row_ok, w_t, H, units, unit_ok, H, BLOCK_K)
        _store(lin + here, linear, rows, row_ok, units, unit_ok, H)
        _store(y + here, h_t + _load(A + here, rows, row_ok, units, unit_ok, H) * (linear - h_t), rows, row_ok,
               units, unit_ok, H)
        _sync(counter, arrivals * (step + 1), SYNC)


@jit
def matrix_backward(A, grad_y, w, G, GA, counters, T, B, H, row0, t_begin, t_end, SYNC: tl.constexpr,
                    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    """The transposed recursion of :func:`matrix_forward`, forwards in time as
    :func:`models.fast.scans._matrix_backward_loop`: ``G_t = grad_y_t + GA_{t-1} W`` (``grad_y_0`` at the first
    frame), ``GA_t = G_t A_t``."""
    rows, units, row_ok, unit_ok, counter, arrivals = _block(row0, B, H, counters, BLOCK_B, BLOCK_H, False)
    for t in range(t_begin, t_end):
        here = t * B * H
        g = _load(grad_y + here, rows, row_ok, units, unit_ok, H)
        if t > 0:  # every program's GA_{t-1}
            g = _product(g, GA + here - B * H, H, rows, row_ok, w, H, units, unit_ok, H, BLOCK_K)
        _store(G + here, g, rows, row_ok, units, unit_ok, H)
        _store(GA + here, g * _load(A + here, rows, row_ok, units, unit_ok, H), rows, row_ok, units, unit_ok, H)
        _sync(counter, arrivals * (t - t_begin + 1), SYNC)
