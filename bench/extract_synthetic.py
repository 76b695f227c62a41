"""Synthetic extraction examples: many document kinds, many schemas, values with known truths.

Training data for the extraction adapter shipped for the default model (issue #14), beside
the SROIE development receipts. Every example is generated here from word lists and
templates, so we may use it freely. What it teaches a small model is to read the field
*name*, not to copy the first line: each schema is a random subset of a document kind's
fields, under one of several names, in random order, with or without descriptions, and
every document has distractors (a due date beside the invoice date, a subtotal beside the
total, the buyer beside the seller). String values are verbatim spans of the document (as
grounded extraction writes them); numbers are written as printed, without thousands
separators (as grounded number copying writes them).

    python bench/extract_synthetic.py 5       # print five examples
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FIRST = (
    "Anna|Ben|Carla|David|Elena|Farid|Grace|Hiro|Ines|Jonas|Kavya|Liam|Mei|Noah|Olga|"
    "Pablo|Quinn|Rosa|Sven|Tariq|Uma|Victor|Wen|Yusuf|Zara"
).split("|")
LAST = (
    "Smith|Okafor|Tanaka|Müller|Rossi|Dubois|Novak|Chen|Garcia|Kowalski|Silva|Haddad|"
    "Lindqvist|Patel|Ibrahim|Moreau|Jensen|Kim|Costa|Walsh"
).split("|")
ADJ = ("Blue|North|Swift|Golden|Green|Bright|Iron|Silver|Red|Coastal|Royal|Prime|Urban|Alpine|Sunny|Harbour").split("|")
NOUN = (
    "Tools|Bakery|Logistics|Pharmacy|Hardware|Books|Electronics|Garden|Motors|Print|Foods|"
    "Textiles|Optics|Coffee|Studio|Labs"
).split("|")
SUFFIX = ["Ltd", "GmbH", "Inc.", "LLC", "SDN BHD", "Co.", "S.A.", "& Sons", "Pty Ltd", ""]
STREET = (
    "Harbour Road|Main Street|Jalan Ampang|Rue de Rivoli|Baker Street|Elm Avenue|"
    "King's Way|Station Road|Market Square|Lakeview Drive"
).split("|")
CITY = (
    "Leeds|Berlin|Kuala Lumpur|Lyon|Osaka|Toronto|Austin|Porto|Krakow|Dublin|Nairobi|Melbourne|Oslo|Seoul|Madrid|Denver"
).split("|")
CARRIER = ["DHL", "UPS", "FedEx", "Royal Mail", "PostNL", "GLS", "Pos Laju"]
ITEMS = (
    "claw hammer|tape measure|USB cable|notebook|coffee beans|desk lamp|printer paper|"
    "screwdriver set|water bottle|phone case|rice 5kg|olive oil|batteries AA|wool socks|"
    "garden hose"
).split("|")
EVENTS = (
    "Spring Jazz Night|Data Science Meetup|Farmers Market|Charity Fun Run|Open Studio Day|"
    "Chess Open|Film Club Screening|Robotics Workshop"
).split("|")
VENUES = ("Town Hall|Riverside Pavilion|Room 4B|Central Library|The Old Mill|Community Centre|Hall C").split("|")
JOBS = (
    "Data Analyst|Warehouse Supervisor|Junior Developer|Nurse|Sales Associate|Graphic Designer|Accountant|Electrician"
).split("|")
PRODUCTS = (
    "Trail Runner 2|AquaPure Filter|Nova X5 Phone|Comfy Office Chair|Zen Tea Set|Volt Power Bank|Echo Desk Lamp"
).split("|")
COLORS = ["black", "white", "red", "navy blue", "olive green", "silver"]
CURRENCIES = ["EUR", "USD", "GBP", "MYR", "JPY", "CHF"]
MONTHS = "January February March April May June July August September October November December".split()


def _company(r: random.Random) -> str:
    return " ".join(x for x in (r.choice(ADJ), r.choice(NOUN), r.choice(SUFFIX)) if x)


def _person(r: random.Random) -> str:
    return f"{r.choice(FIRST)} {r.choice(LAST)}"


def _date(r: random.Random) -> str:
    y, mo, d = r.randint(2019, 2026), r.randint(1, 12), r.randint(1, 28)
    style = r.randrange(6)
    if style == 0:
        return f"{d} {MONTHS[mo - 1]} {y}"
    if style == 1:
        return f"{y}-{mo:02d}-{d:02d}"
    if style == 2:
        return f"{d:02d}/{mo:02d}/{y}"
    if style == 3:
        return f"{MONTHS[mo - 1][:3]} {d}, {y}"
    if style == 4:
        return f"{d:02d}.{mo:02d}.{y}"
    return f"{d:02d}-{MONTHS[mo - 1][:3].upper()}-{y % 100:02d}"


def _time(r: random.Random) -> str:
    h, m = r.randint(7, 21), r.choice([0, 15, 30, 45, 5, 50])
    return f"{h:02d}:{m:02d}" if r.random() < 0.6 else f"{(h - 1) % 12 + 1}:{m:02d} {'PM' if h >= 12 else 'AM'}"


def _money(r: random.Random, lo: float, hi: float) -> tuple[str, str]:
    """(as printed, as the answer writes it): '1,234.50' -> '1234.50'."""
    value = r.uniform(lo, hi)
    printed = f"{value:,.2f}" if value >= 1000 and r.random() < 0.7 else f"{value:.2f}"
    return printed, printed.replace(",", "")


def _code(r: random.Random, prefix: str, digits: int) -> str:
    return prefix + "".join(r.choice("0123456789") for _ in range(digits))


def _address(r: random.Random) -> str:
    return f"{r.randint(1, 220)} {r.choice(STREET)}, {r.choice(CITY)}"


def _phone(r: random.Random) -> str:
    return f"+{r.randint(1, 99)} {r.randint(100, 999)} {r.randint(100, 999)} {r.randint(1000, 9999)}"


@dataclass
class Field:
    """One field of a document kind: its possible names, type, description and value."""

    names: list[str]
    kind: str  # "string", "number", "integer" or "enum:<a>|<b>|..."
    description: str
    value: Any  # the answer (a number field's value is the string as printed, without commas)


def _items(r: random.Random, currency: str) -> tuple[list[str], float]:
    lines, total = [], 0.0
    for _ in range(r.randint(1, 4)):
        qty, item = r.randint(1, 3), r.choice(ITEMS)
        price = round(r.uniform(1, 60), 2)
        total += qty * price
        lines.append(f"{qty} x {item:<16} {qty * price:8.2f}")
    return lines, total


def invoice(r: random.Random) -> tuple[list[str], list[Field]]:
    seller, buyer, cur = _company(r), _company(r), r.choice(CURRENCIES)
    number = r.choice(
        [_code(r, "INV-", 4), _code(r, "#", 6), _code(r, "A", 7), f"{r.randint(2019, 2026)}/{r.randint(1, 999):03d}"]
    )
    date, due = _date(r), _date(r)
    items, sub = _items(r, cur)
    tax = round(sub * r.choice([0.06, 0.1, 0.2]), 2)
    total = f"{sub + tax:.2f}"
    lines = [
        f"{seller}, {_address(r)}",
        r.choice(["INVOICE", "Tax Invoice", "Invoice"]) + f" {r.choice(['No.', '#', 'number'])} {number}",
    ]
    lines.append(f"{r.choice(['Date', 'Invoice date', 'Issued'])}: {date}")
    lines += [f"Bill to: {buyer}", *items, f"Subtotal {sub:.2f}", f"Tax {tax:.2f}"]
    lines.append(f"{r.choice(['TOTAL DUE', 'Total', 'Amount due', 'GRAND TOTAL'])} ({cur}) {total}")
    lines.append(f"Payment due by {due}")
    fields = [
        Field(["invoice_number", "invoice_no", "invoice_id"], "string", "the invoice number", number),
        Field(["seller", "vendor", "issuer"], "string", "the company that issued the invoice", seller),
        Field(["buyer", "customer", "bill_to"], "string", "the company billed", buyer),
        Field(["date", "invoice_date", "issue_date"], "string", "the invoice date as written", date),
        Field(["due_date", "payment_due"], "string", "when payment is due", due),
        Field(["total", "amount_due", "grand_total"], "number", "the total amount due, a number", total),
        Field(["tax", "vat", "tax_amount"], "number", "the tax amount", f"{tax:.2f}"),
        Field(["currency", "currency_code"], f"enum:{'|'.join(CURRENCIES)}", "currency code such as EUR or USD", cur),
    ]
    return lines, fields


def receipt(r: random.Random) -> tuple[list[str], list[Field]]:
    store, cashier = _company(r).upper(), _person(r)
    date, time = _date(r), _time(r)
    items, sub = _items(r, "")
    total = f"{sub:.2f}"
    paid = r.choice(["cash", "card"])
    given = f"{float(total) + r.choice([0.5, 1, 5, 10, 20]):.2f}"
    lines = [store, _address(r).upper(), f"TEL {_phone(r)}", f"{date} {time}", f"CASHIER: {cashier}", *items]
    lines += [f"TOTAL {total}", f"{paid.upper()} {given if paid == 'cash' else total}"]
    if paid == "cash":
        lines.append(f"CHANGE {float(given) - float(total):.2f}")
    lines.append(r.choice(["THANK YOU", "PLEASE COME AGAIN", "GOODS SOLD ARE NOT RETURNABLE"]))
    fields = [
        Field(["store", "shop", "merchant", "company"], "string", "the shop's name", store),
        Field(["date", "purchase_date"], "string", "the date of the purchase", date),
        Field(["time", "purchase_time"], "string", "the time of the purchase", time),
        Field(["total", "total_amount", "amount"], "number", "the total paid", total),
        Field(["cashier", "served_by"], "string", "the cashier's name", cashier),
        Field(["payment_method", "paid_by"], "enum:cash|card", "how it was paid", paid),
    ]
    return lines, fields


def contact(r: random.Random) -> tuple[list[str], list[Field]]:
    name, other, company = _person(r), _person(r), _company(r)
    title = r.choice(["Head of Sales", "Office Manager", "CTO", "Account Executive", "Lab Technician"])
    user = name.split()[0].lower()
    domain = company.split()[0].lower() + r.choice([".com", ".de", ".co.uk", ".io"])
    email, phone, city = f"{user}@{domain}", _phone(r), r.choice(CITY)
    lines = [
        f"Hi {other.split()[0]},",
        r.choice(["Thanks for the call today.", "Please find the quote attached.", "See you next week."]),
        "Best regards,",
        name,
        f"{title} | {company}",
        f"{city} office",
        f"Tel: {phone}",
        f"Email: {email}",
    ]
    fields = [
        Field(["name", "full_name", "sender"], "string", "the sender's name", name),
        Field(["job_title", "title", "role"], "string", "the sender's job title", title),
        Field(["company", "organisation", "employer"], "string", "the sender's company", company),
        Field(["email", "email_address"], "string", "the sender's email address", email),
        Field(["phone", "phone_number", "telephone"], "string", "the sender's phone number", phone),
        Field(["city", "office_city"], "string", "the city of the sender's office", city),
    ]
    return lines, fields


def event(r: random.Random) -> tuple[list[str], list[Field]]:
    name, venue, city, date, time = r.choice(EVENTS), r.choice(VENUES), r.choice(CITY), _date(r), _time(r)
    price, price_out = _money(r, 3, 80)
    organiser = _company(r)
    lines = [
        f"{r.choice(['Join us for the', 'Announcing:', 'Welcome to the'])} {name}!",
        f"When: {date}, doors open {time}",
        f"Where: {venue}, {city}",
        f"Tickets: {price} at the door",
        f"Organised by {organiser}",
        f"Registration closes {_date(r)}.",
    ]
    fields = [
        Field(["event", "event_name", "name"], "string", "the event's name", name),
        Field(["date", "event_date"], "string", "the date of the event", date),
        Field(["start_time", "time"], "string", "when doors open", time),
        Field(["venue", "location"], "string", "the venue", venue),
        Field(["city"], "string", "the city", city),
        Field(["ticket_price", "price"], "number", "the ticket price", price_out),
        Field(["organiser", "organizer", "host"], "string", "who organises it", organiser),
    ]
    return lines, fields


def shipping(r: random.Random) -> tuple[list[str], list[Field]]:
    order, tracking, carrier = (
        _code(r, r.choice(["", "ORD-", "#"]), 6),
        _code(r, r.choice(["1Z", "JD", "RR"]), 10),
        r.choice(CARRIER),
    )
    customer, date, weight = _person(r), _date(r), f"{r.uniform(0.2, 30):.1f}"
    items = r.randint(1, 9)
    lines = [
        f"Dear {customer},",
        f"Your order {order} has shipped with {carrier}.",
        f"Tracking number: {tracking}",
        f"Estimated delivery: {date}",
        f"Parcel weight: {weight} kg, {items} item(s)",
        f"Ordered on {_date(r)}. Questions? Reply to this email.",
    ]
    fields = [
        Field(["order_number", "order_id"], "string", "the order number", order),
        Field(["tracking_number", "tracking_id"], "string", "the parcel's tracking number", tracking),
        Field(["carrier", "courier"], "string", "the delivery company", carrier),
        Field(["customer", "recipient", "customer_name"], "string", "the customer's name", customer),
        Field(["delivery_date", "estimated_delivery"], "string", "the estimated delivery date", date),
        Field(["weight_kg", "weight"], "number", "the parcel weight in kg", weight),
        Field(["item_count", "items"], "integer", "how many items", items),
    ]
    return lines, fields


def flight(r: random.Random) -> tuple[list[str], list[Field]]:
    passenger, flight_no = _person(r).upper(), f"{r.choice(['LH', 'BA', 'MH', 'AF', 'NH', 'AC'])}{r.randint(10, 9999)}"
    origin, dest = r.sample(CITY, 2)
    date, seat, ref = (
        _date(r),
        f"{r.randint(1, 45)}{r.choice('ABCDEF')}",
        "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6)),
    )
    lines = [
        "BOOKING CONFIRMATION",
        f"Booking reference: {ref}",
        f"Passenger: {passenger}",
        f"Flight {flight_no}  {origin} -> {dest}",
        f"Departure: {date} {_time(r)}",
        f"Seat {seat}, {r.choice(['Economy', 'Business', 'Premium Economy'])}",
        "Baggage: 1 x 23 kg",
    ]
    fields = [
        Field(["passenger", "passenger_name", "traveller"], "string", "the passenger's name", passenger),
        Field(["flight_number", "flight"], "string", "the flight number", flight_no),
        Field(["origin", "departure_city", "from_city"], "string", "where the flight leaves from", origin),
        Field(["destination", "arrival_city", "to_city"], "string", "where the flight goes", dest),
        Field(["date", "departure_date"], "string", "the departure date", date),
        Field(["seat"], "string", "the seat", seat),
        Field(["booking_reference", "pnr", "confirmation_code"], "string", "the booking reference", ref),
    ]
    return lines, fields


def job(r: random.Random) -> tuple[list[str], list[Field]]:
    title, company, city = r.choice(JOBS), _company(r), r.choice(CITY)
    salary, kind = r.randrange(28, 120) * 1000, r.choice(["full-time", "part-time", "contract"])
    contact_email = f"jobs@{company.split()[0].lower()}.com"
    lines = [
        f"{company} is hiring!",
        f"Position: {title} ({kind})",
        f"Location: {city}",
        f"Salary: {salary} per year",
        f"{r.randint(2, 8)} years of experience preferred.",
        f"Apply to {contact_email} before {_date(r)}.",
    ]
    fields = [
        Field(["job_title", "position", "role"], "string", "the job title", title),
        Field(["company", "employer"], "string", "the hiring company", company),
        Field(["location", "city"], "string", "where the job is", city),
        Field(["salary", "annual_salary"], "integer", "the yearly salary", salary),
        Field(["employment_type", "contract_type"], "enum:full-time|part-time|contract", "the kind of contract", kind),
        Field(["contact_email", "apply_to"], "string", "where to apply", contact_email),
    ]
    return lines, fields


def appointment(r: random.Random) -> tuple[list[str], list[Field]]:
    patient, doctor, clinic = (
        _person(r),
        "Dr. " + _person(r),
        f"{r.choice(ADJ)} {r.choice(['Clinic', 'Medical Centre', 'Dental Care', 'Health Practice'])}",
    )
    date, time, room = _date(r), _time(r), f"Room {r.randint(1, 30)}"
    lines = [
        clinic,
        _address(r),
        f"Appointment reminder for {patient}",
        f"You are booked with {doctor} on {date} at {time}, {room}.",
        f"Please arrive 10 minutes early. To cancel call {_phone(r)}.",
    ]
    fields = [
        Field(["patient", "patient_name"], "string", "the patient's name", patient),
        Field(["doctor", "practitioner"], "string", "the doctor", doctor),
        Field(["clinic", "practice"], "string", "the clinic's name", clinic),
        Field(["date", "appointment_date"], "string", "the appointment date", date),
        Field(["time", "appointment_time"], "string", "the appointment time", time),
    ]
    return lines, fields


def product(r: random.Random) -> tuple[list[str], list[Field]]:
    name, brand, color = (
        r.choice(PRODUCTS),
        r.choice(ADJ) + r.choice(["tech", "wear", "home", "gear"]),
        r.choice(COLORS),
    )
    price, price_out = _money(r, 5, 1500)
    was = f"{float(price_out) * r.uniform(1.1, 1.5):.2f}"
    sku, stock = _code(r, "SKU-", 6), r.randint(0, 250)
    lines = [
        f"{name} by {brand}",
        f"Colour: {color}",
        f"Now {price} (was {was})",
        f"Item code {sku}",
        f"{stock} in stock. Free delivery over 50.00.",
    ]
    fields = [
        Field(["product", "product_name", "name"], "string", "the product's name", name),
        Field(["brand", "manufacturer"], "string", "the brand", brand),
        Field(["price", "current_price"], "number", "the current price", price_out),
        Field(["sku", "item_code"], "string", "the item code", sku),
        Field(["color", "colour"], "string", "the colour", color),
        Field(["stock", "in_stock"], "integer", "how many are in stock", stock),
    ]
    return lines, fields


KINDS: dict[str, Callable[[random.Random], tuple[list[str], list[Field]]]] = {
    "invoice": invoice,
    "receipt": receipt,
    "contact": contact,
    "event": event,
    "shipping": shipping,
    "flight": flight,
    "job": job,
    "appointment": appointment,
    "product": product,
}


def _node(f: Field, describe: bool) -> dict[str, Any]:
    if f.kind.startswith("enum:"):
        node: dict[str, Any] = {"type": "string", "enum": f.kind[5:].split("|")}
    else:
        node = {"type": f.kind}
    if describe:
        node["description"] = f.description
    return node


def example(r: random.Random, kind: str | None = None) -> dict[str, Any]:
    """One ``{text, output, schema, kind}`` row: a document, a JSON Schema and the answer."""
    kind = kind or r.choice(sorted(KINDS))
    lines, fields = KINDS[kind](r)
    chosen = r.sample(fields, r.randint(2, min(5, len(fields))))
    describe = r.random() < 0.6
    props, output = {}, {}
    for f in chosen:
        name = r.choice(f.names)
        if name in props:
            continue
        props[name] = _node(f, describe)
        output[name] = f.value
    schema = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    return {"text": "\n".join(lines) + "\n", "output": output, "schema": schema, "kind": kind}


def examples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` examples, the kinds in turn, reproducible from ``seed``."""
    r = random.Random(seed)
    kinds = sorted(KINDS)
    return [example(r, kinds[i % len(kinds)]) for i in range(n)]


if __name__ == "__main__":
    for row in examples(
        int(sys.argv[1]) if len(sys.argv) > 1 else 3, seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0
    ):
        print(row["text"] + json.dumps(row["schema"]["properties"]) + "\n-> " + json.dumps(row["output"]) + "\n")
