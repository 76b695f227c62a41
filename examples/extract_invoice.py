"""Quick start: extract an invoice's fields into a validated Pydantic object.

Runs on the embedded default model (SmolLM2-135M-Instruct). The output is constrained by
the schema's grammar, so it always parses and validates; a 135M model still gets some
values wrong, which is why the fields are checked, not trusted.
"""

from invoice_schema import Invoice

from pocket_agent import extract

TEXT = """\
ACME Tools Ltd, 12 Harbour Road, Leeds
INVOICE INV-2041
Date: 1 March 2024
2 x claw hammer      19.90
1 x tape measure      4.50
TOTAL DUE (EUR)      44.30
"""

invoice = extract(TEXT, schema=Invoice)
print(repr(invoice))
print(invoice.model_dump_json(indent=2))
