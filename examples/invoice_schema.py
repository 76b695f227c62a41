"""The invoice schema used by the quick start and the CLI example."""

from pydantic import BaseModel, Field


class Invoice(BaseModel):
    """An invoice's key fields."""

    invoice_number: str = Field(description="the invoice number, e.g. INV-2041")
    seller: str = Field(description="the company that issued the invoice")
    date: str = Field(description="the invoice date as written")
    total: float = Field(description="the total amount due, a number")
    currency: str = Field(description="currency code such as EUR or USD")
