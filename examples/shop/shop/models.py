"""The payload models: all a producer needs to import (no handler code)."""

from pydantic import BaseModel, Field


class Receipt(BaseModel):
    order_id: str
    email: str
    total_cents: int = Field(ge=0)
