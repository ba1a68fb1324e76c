"""One import point for the controller framework: os-ken, or Ryu where only Ryu is installed.

The two share an API; only the package and the base-class names differ. CONF is the framework's
own configuration object, the one osken-manager (or ryu-manager) parses: options registered
on oslo.config's global CONF instead are silently never read.
"""
try:
    from os_ken.base.app_manager import OSKenApp as App
    from os_ken.cfg import CONF
    from os_ken.controller import ofp_event
    from os_ken.controller.event import EventBase, EventReplyBase, EventRequestBase
    from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from os_ken.lib import hub
    from os_ken.ofproto import ofproto_v1_3
except ImportError:  # pragma: no cover - only where Ryu replaces os-ken
    from ryu.base.app_manager import RyuApp as App
    from ryu.cfg import CONF
    from ryu.controller import ofp_event
    from ryu.controller.event import EventBase, EventReplyBase, EventRequestBase
    from ryu.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from ryu.lib import hub
    from ryu.ofproto import ofproto_v1_3

__all__ = ["App", "CONF", "CONFIG_DISPATCHER", "DEAD_DISPATCHER", "EventBase", "EventReplyBase",
           "EventRequestBase", "MAIN_DISPATCHER", "hub", "ofp_event", "ofproto_v1_3", "set_ev_cls"]
