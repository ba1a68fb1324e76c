"""One import point for the controller framework: the one running the app, os-ken or Ryu.

The two share an API; only the package and the base-class names differ. The manager that loads the
app (osken-manager or ryu-manager) has imported its own framework first, so that is the one used when
both are installed: events, the app base class and CONF must all be the running manager's, or the app
would register with a second, idle framework. CONF is the framework's own configuration object, the
one its manager parses: options registered on oslo.config's global CONF instead are never read.
Imported on its own (tests, tools), os-ken is preferred.
"""
import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol, TypeVar

_Handler = TypeVar("_Handler", bound=Callable[..., Any])


class _Decorator(Protocol):
    def __call__(self, handler: _Handler, /) -> _Handler: ...


def _framework() -> str:
    if "ryu.base.app_manager" in sys.modules and "os_ken.base.app_manager" not in sys.modules:
        return "ryu"
    try:
        importlib.import_module("os_ken")
    except ImportError:
        return "ryu"
    return "os_ken"


FRAMEWORK = _framework()


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"{FRAMEWORK}.{name}")


App = getattr(_load("base.app_manager"), "OSKenApp" if FRAMEWORK == "os_ken" else "RyuApp")
CONF = _load("cfg").CONF
ofp_event = _load("controller.ofp_event")
_event, _handler = _load("controller.event"), _load("controller.handler")
EventBase, EventReplyBase, EventRequestBase = _event.EventBase, _event.EventReplyBase, _event.EventRequestBase
CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER = (_handler.CONFIG_DISPATCHER, _handler.DEAD_DISPATCHER,
                                                       _handler.MAIN_DISPATCHER)
# Typed here (the framework is untyped): it registers a handler and returns it unchanged.
set_ev_cls: Callable[..., _Decorator] = _handler.set_ev_cls
hub = _load("lib.hub")
ofproto_v1_3 = _load("ofproto.ofproto_v1_3")


def openflow_controller() -> ModuleType:
    """The framework's OpenFlow connection module (its Datapath and connection factory)."""
    return _load("controller.controller")


__all__ = ["App", "CONF", "CONFIG_DISPATCHER", "DEAD_DISPATCHER", "EventBase", "EventReplyBase", "EventRequestBase",
           "FRAMEWORK", "MAIN_DISPATCHER", "hub", "ofp_event", "ofproto_v1_3", "openflow_controller", "set_ev_cls"]
