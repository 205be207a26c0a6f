"""Cross-program synchronisation inside one Triton launch, shared by the kernels that finish
a reduction in the program that arrives last (verify, tree_verify, attention's in-kernel split
merge): a GPU-scope fence and the ticket of the "last program finishes" pattern.

The tickets live in a caller's buffer that is zero when a launch starts; the winner of each
group puts its ticket back to zero, so a launch that starts with zeros ends with zeros and a
persistent workspace (kernels/_workspace.py) needs no fill before the next launch. Under the
interpreter programs run one after another (FENCE=False there: inline PTX cannot run on a CPU).

grid_barrier makes every program of a launch wait for all the others: only for grids whose
programs are all resident at once (a launcher's promise: see its docstring), and under the
interpreter only for one-program grids (the first program would wait for ones that run after it).
"""
import triton
import triton.language as tl


@triton.jit
def fence_gpu():
    """fence.acq_rel.gpu in every thread (inline PTX: GPU only)."""
    tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def last_program_of(ticket_ptr, count, FENCE: tl.constexpr):
    """Ticket for the "last program finishes" pattern: every program of a group calls this once
    after its stores; True in the one that arrives last, which may then read every other
    program's stores (through L2: load them with cache_modifier=".cg"). The classic sequence:
    each thread fences its stores (FENCE: on a GPU; the interpreter runs programs one after
    another), a barrier, one thread takes an acq_rel ticket (integer: order-free), and the
    winner's threads fence again before reading.
    The winner also puts the ticket back to zero (every other program of the group has taken
    its ticket by then): a counter that starts a launch at zero ends it at zero, so a caller's
    persistent workspace (kernels/_workspace.py) needs no zero fill before the next launch."""
    if FENCE:
        fence_gpu()
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    last = ticket == count - 1
    tl.atomic_xchg(ticket_ptr, 0, mask=last, sem="relaxed", scope="gpu")
    if FENCE:
        fence_gpu()
    return last


@triton.jit
def last_rows_of(ticket_ptr, live, count, FENCE: tl.constexpr):
    """last_program_of for the rows of a tile: each live lane takes a ticket at ticket_ptr (a
    pointer per lane; lanes may share one); True in the lane that takes the count-th, which puts
    its ticket back to zero (as last_program_of)."""
    if FENCE:
        fence_gpu()
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr, 1, mask=live, sem="acq_rel", scope="gpu")
    last = live & (ticket == count - 1)
    tl.atomic_xchg(ticket_ptr, tl.zeros_like(ticket), mask=last, sem="relaxed", scope="gpu")
    if FENCE:
        fence_gpu()
    return last


@triton.jit
def grid_barrier(counter_ptr, target, FENCE: tl.constexpr, SPIN_LIMIT: tl.constexpr):
    """Every program of the launch waits here until all P have arrived: the counter (zero when
    the launch starts) counts the arrivals of every barrier of the launch, so the i-th barrier
    (1-based) passes when it reaches target = P * i. Before arriving, each thread fences its stores
    (FENCE: on a GPU), so that after the barrier every program may read them (through L2: loads
    with cache_modifier=".cg"; L1 may hold a line read before the barrier).
    The grid must be resident at once (programs that wait hold their SMs: a program not yet
    scheduled would never come). As a guard against a launcher that breaks that promise, a
    program polls at most SPIN_LIMIT times (each poll an L2 round trip, ~1 us) and then goes on:
    True when the barrier passed, False when the program gave up (its results are then wrong;
    the caller records it). The caller puts the counter back to zero once every program has
    passed its last barrier (e.g. the winner of a last_program_of ticket taken after it)."""
    if FENCE:
        fence_gpu()
    tl.debug_barrier()
    seen = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") + 1
    spins = 0
    while (seen < target) & (spins < SPIN_LIMIT):
        seen = tl.load(counter_ptr, volatile=True)
        spins += 1
    tl.debug_barrier()
    if FENCE:
        fence_gpu()
    return seen >= target
