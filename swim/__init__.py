"""SWIM membership with Lifeguard, as a sans-IO state machine.

`Membership` is the protocol: feed it packets and the time, apply the `Send`s and
events it returns, and call `tick` at `next_deadline()`. Nothing in this package does
I/O, reads a clock or uses a global random generator, so the Trio daemon and the
simulator drive the very same code. See docs/protocol.md and docs/configuration.md.

Simulations of large clusters: build one `SharedView` of the converged membership and
`prime()` every core with it (records are shared copy-on-write), then call `gc.freeze()`
so Python's cyclic collector stops walking the ~n^2 entries of all the views.
"""

from ._events import Address as Address
from ._events import AppMessage as AppMessage
from ._events import Event as Event
from ._events import IncarnationExhausted as IncarnationExhausted
from ._events import Member as Member
from ._events import MemberFailed as MemberFailed
from ._events import MemberJoined as MemberJoined
from ._events import MemberLeft as MemberLeft
from ._events import MemberRecovered as MemberRecovered
from ._events import MemberState as MemberState
from ._events import MemberSuspected as MemberSuspected
from ._events import MemberUpdated as MemberUpdated
from ._events import Output as Output
from ._events import SelfRefuted as SelfRefuted
from ._events import Send as Send
from ._faults import Faults as Faults
from ._membership import Membership as Membership
from ._records import SharedView as SharedView
from ._stats import MembershipStatistics as MembershipStatistics
from .app import AppState as AppState
from .awareness import Awareness as Awareness
from .broadcast import TransmitLimitedQueue as TransmitLimitedQueue
from .config import SwimConfig as SwimConfig
from .rejoin import RejoinConfig as RejoinConfig
from .rejoin import RejoinPolicy as RejoinPolicy
from .suspicion import Suspicion as Suspicion
from .suspicion import remaining_suspicion_time as remaining_suspicion_time
from .wire import INCARNATION_MAX as INCARNATION_MAX
from .wire import PROTOCOL_VERSION as PROTOCOL_VERSION
from .wire import DecodeCache as DecodeCache
from .wire import DecodeError as DecodeError
from .wire import MessageType as MessageType

__all__ = [
    "INCARNATION_MAX",
    "PROTOCOL_VERSION",
    "Address",
    "AppMessage",
    "AppState",
    "Awareness",
    "DecodeCache",
    "DecodeError",
    "Event",
    "Faults",
    "IncarnationExhausted",
    "Member",
    "MemberFailed",
    "MemberJoined",
    "MemberLeft",
    "MemberRecovered",
    "MemberState",
    "MemberSuspected",
    "MemberUpdated",
    "Membership",
    "MembershipStatistics",
    "MessageType",
    "Output",
    "RejoinConfig",
    "RejoinPolicy",
    "SelfRefuted",
    "Send",
    "SharedView",
    "Suspicion",
    "SwimConfig",
    "TransmitLimitedQueue",
    "remaining_suspicion_time",
]
