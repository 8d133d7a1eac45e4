"""The doors the proxy serves, in one place: the app's routes and its choice of error shape come from here."""

from __future__ import annotations

from proxy.doors.chat import ChatCompletions
from proxy.doors.door import DoorType
from proxy.doors.gemini import Gemini
from proxy.doors.messages import Messages
from proxy.doors.responses import Responses

DOORS: tuple[DoorType, ...] = (ChatCompletions, Responses, Messages, Gemini)
