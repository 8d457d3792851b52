"""Generate the bundled text-to-SQL databases and questions, deterministically from a seed.

Run ``python -m skyrl_gym.envs.sql.data.build`` to rewrite the shipped files in place, or pass ``--out DIR`` to
write them elsewhere. The output is::

    DIR/databases/bookstore/bookstore.sqlite
    DIR/databases/school/school.sqlite
    DIR/databases/flights/flights.sqlite
    DIR/questions.jsonl        one {"db_id", "question", "sql"} object per line

The same seed gives the same rows; with the same SQLite library it also gives byte-identical files.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import random
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from skyrl_gym.envs.sql.data import DB_IDS

__all__ = ["DB_IDS", "DEFAULT_SEED", "QUESTIONS", "build_all", "build_database", "write_questions"]

DEFAULT_SEED = 20240611

Row = tuple[Any, ...]
Tables = dict[str, list[Row]]

_FIRST_NAMES = (
    "Ada", "Ben", "Chloe", "Diego", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Luca", "Maya",
    "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wei", "Ximena", "Yusuf", "Zoe",
)  # fmt: skip
_LAST_NAMES = (
    "Abbott", "Becker", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Haddad", "Ivanova", "Jensen", "Kowalski",
    "Larsen", "Moreau", "Nakamura", "Okafor", "Petrov", "Quintero", "Rossi", "Schmidt", "Tanaka", "Usman", "Varga",
    "Weber", "Yilmaz", "Zhang",
)  # fmt: skip
_COUNTRIES = ("USA", "UK", "France", "Germany", "Japan", "Brazil", "Nigeria", "India", "Canada", "Italy")
_START = datetime.date(2023, 1, 1)


def _person(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST_NAMES)} {rng.choice(_LAST_NAMES)}"


def _day(rng: random.Random, span_days: int) -> str:
    return (_START + datetime.timedelta(days=rng.randrange(span_days))).isoformat()


# --- bookstore ---------------------------------------------------------------------------------------------------

_BOOKSTORE_SCHEMA = """
CREATE TABLE authors (
    author_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    country TEXT NOT NULL,
    birth_year INTEGER
);
CREATE TABLE books (
    book_id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    author_id INTEGER NOT NULL REFERENCES authors (author_id),
    genre TEXT NOT NULL,
    price REAL NOT NULL,
    published_year INTEGER NOT NULL,
    stock INTEGER NOT NULL
);
CREATE TABLE customers (
    customer_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    city TEXT NOT NULL,
    joined_on TEXT NOT NULL
);
CREATE TABLE orders (
    order_id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers (customer_id),
    order_date TEXT NOT NULL,
    status TEXT NOT NULL
);
CREATE TABLE order_items (
    order_id INTEGER NOT NULL REFERENCES orders (order_id),
    book_id INTEGER NOT NULL REFERENCES books (book_id),
    quantity INTEGER NOT NULL,
    unit_price REAL NOT NULL,
    PRIMARY KEY (order_id, book_id)
);
"""

_GENRES = ("Fantasy", "Mystery", "Science Fiction", "History", "Poetry", "Romance", "Biography")
_TITLE_WORDS = (
    "Silent", "River", "Glass", "Garden", "Winter", "Empire", "Shadow", "Letters", "Northern", "Clockwork", "Salt",
    "Orchard", "Harbor", "Lantern", "Atlas", "Echo", "Copper", "Meadow", "Tide", "Ember",
)  # fmt: skip
_CITIES = ("Lisbon", "Osaka", "Toronto", "Lagos", "Berlin", "Austin", "Lyon", "Pune")


def _bookstore(rng: random.Random) -> Tables:
    authors = [
        (i, _person(rng), rng.choice(_COUNTRIES), None if rng.random() < 0.15 else rng.randint(1920, 1995))
        for i in range(1, 31)
    ]
    books = []
    for i in range(1, 121):
        title = f"The {rng.choice(_TITLE_WORDS)} {rng.choice(_TITLE_WORDS)}"
        books.append(
            (
                i,
                title,
                rng.randint(1, 30),
                rng.choice(_GENRES),
                round(rng.uniform(6, 45), 2),
                rng.randint(1965, 2023),
                rng.randint(0, 40),
            )
        )
    customers = [(i, _person(rng), rng.choice(_CITIES), _day(rng, 365)) for i in range(1, 61)]
    statuses = ("shipped", "shipped", "shipped", "pending", "cancelled")
    orders = [(i, rng.randint(1, 60), _day(rng, 540), rng.choice(statuses)) for i in range(1, 121)]
    items: list[Row] = []
    for order_id in range(1, 121):
        for book_id in sorted(rng.sample(range(1, 121), rng.randint(1, 3))):
            if len(items) < 200:
                items.append((order_id, book_id, rng.randint(1, 4), books[book_id - 1][4]))
    return {"authors": authors, "books": books, "customers": customers, "orders": orders, "order_items": items}


# --- school ------------------------------------------------------------------------------------------------------

_SCHOOL_SCHEMA = """
CREATE TABLE departments (
    dept_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    building TEXT NOT NULL,
    budget REAL NOT NULL
);
CREATE TABLE teachers (
    teacher_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    dept_id INTEGER NOT NULL REFERENCES departments (dept_id),
    hire_year INTEGER NOT NULL,
    salary REAL NOT NULL
);
CREATE TABLE students (
    student_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    enrollment_year INTEGER NOT NULL,
    major_dept_id INTEGER REFERENCES departments (dept_id),
    gpa REAL
);
CREATE TABLE courses (
    course_id INTEGER PRIMARY KEY,
    code TEXT NOT NULL UNIQUE,
    title TEXT NOT NULL,
    dept_id INTEGER NOT NULL REFERENCES departments (dept_id),
    teacher_id INTEGER NOT NULL REFERENCES teachers (teacher_id),
    credits INTEGER NOT NULL
);
CREATE TABLE enrollments (
    student_id INTEGER NOT NULL REFERENCES students (student_id),
    course_id INTEGER NOT NULL REFERENCES courses (course_id),
    term TEXT NOT NULL,
    grade TEXT,
    PRIMARY KEY (student_id, course_id)
);
"""

_SUBJECTS = (
    ("Mathematics", "MATH"), ("Physics", "PHYS"), ("Chemistry", "CHEM"), ("Biology", "BIOL"),
    ("Computer Science", "CS"), ("History", "HIST"), ("Philosophy", "PHIL"), ("Economics", "ECON"),
    ("Linguistics", "LING"), ("Music", "MUS"), ("Geology", "GEOL"), ("Psychology", "PSYC"),
    ("Sociology", "SOC"), ("Art History", "ARTH"), ("Astronomy", "ASTR"), ("Statistics", "STAT"),
    ("Literature", "LIT"), ("Architecture", "ARCH"), ("Nursing", "NURS"), ("Law", "LAW"),
)  # fmt: skip
_COURSE_TOPICS = ("Foundations", "Methods", "Seminar", "Theory", "Laboratory", "Topics", "Advanced Studies")
_BUILDINGS = ("North Hall", "Science Center", "Old Library", "West Annex", "Riverside")
_GRADES = ("A", "A", "B", "B", "B", "C", "C", "D", "F")


def _school(rng: random.Random) -> Tables:
    departments = [
        (i, name, rng.choice(_BUILDINGS), float(rng.randrange(200_000, 2_000_000, 5_000)))
        for i, (name, _) in enumerate(_SUBJECTS, start=1)
    ]
    teachers = [
        (i, _person(rng), rng.randint(1, 20), rng.randint(1995, 2023), float(rng.randrange(52_000, 140_000, 500)))
        for i in range(1, 61)
    ]
    students = [
        (
            i,
            _person(rng),
            rng.randint(2019, 2023),
            None if rng.random() < 0.1 else rng.randint(1, 20),
            None if rng.random() < 0.05 else round(rng.uniform(1.8, 4.0), 2),
        )
        for i in range(1, 151)
    ]
    courses = []
    for i in range(1, 51):
        dept_id = rng.randint(1, 20)
        prefix = _SUBJECTS[dept_id - 1][1]
        dept_teachers = [t[0] for t in teachers if t[2] == dept_id] or [rng.randint(1, 60)]
        title = f"{_SUBJECTS[dept_id - 1][0]} {rng.choice(_COURSE_TOPICS)}"
        courses.append((i, f"{prefix}{100 + i}", title, dept_id, rng.choice(dept_teachers), rng.choice((2, 3, 3, 4))))
    enrollments: list[Row] = []
    taken: set[tuple[int, int]] = set()
    while len(enrollments) < 200:
        student_id, course_id = rng.randint(1, 150), rng.randint(1, 50)
        if (student_id, course_id) in taken:
            continue
        taken.add((student_id, course_id))
        term = rng.choice(("2023-fall", "2024-spring", "2024-fall"))
        grade = None if term == "2024-fall" else rng.choice(_GRADES)
        enrollments.append((student_id, course_id, term, grade))
    return {
        "departments": departments,
        "teachers": teachers,
        "students": students,
        "courses": courses,
        "enrollments": enrollments,
    }


# --- flights -----------------------------------------------------------------------------------------------------

_FLIGHTS_SCHEMA = """
CREATE TABLE airports (
    airport_code TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    city TEXT NOT NULL,
    country TEXT NOT NULL,
    elevation_ft INTEGER NOT NULL
);
CREATE TABLE airlines (
    airline_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    iata_code TEXT NOT NULL UNIQUE,
    country TEXT NOT NULL
);
CREATE TABLE flights (
    flight_id INTEGER PRIMARY KEY,
    flight_number TEXT NOT NULL,
    airline_id INTEGER NOT NULL REFERENCES airlines (airline_id),
    origin TEXT NOT NULL REFERENCES airports (airport_code),
    destination TEXT NOT NULL REFERENCES airports (airport_code),
    departure_time TEXT NOT NULL,
    duration_min INTEGER NOT NULL,
    distance_km INTEGER NOT NULL,
    status TEXT NOT NULL
);
CREATE TABLE passengers (
    passenger_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    nationality TEXT NOT NULL,
    birth_year INTEGER NOT NULL
);
CREATE TABLE bookings (
    booking_id INTEGER PRIMARY KEY,
    flight_id INTEGER NOT NULL REFERENCES flights (flight_id),
    passenger_id INTEGER NOT NULL REFERENCES passengers (passenger_id),
    fare_class TEXT NOT NULL,
    price REAL NOT NULL
);
"""

_AIRPORTS = (
    ("LIS", "Humberto Delgado", "Lisbon", "Portugal", 374), ("MAD", "Barajas", "Madrid", "Spain", 1998),
    ("CDG", "Charles de Gaulle", "Paris", "France", 392), ("ORY", "Orly", "Paris", "France", 291),
    ("FRA", "Frankfurt", "Frankfurt", "Germany", 364), ("MUC", "Franz Josef Strauss", "Munich", "Germany", 1487),
    ("LHR", "Heathrow", "London", "UK", 83), ("LGW", "Gatwick", "London", "UK", 202),
    ("AMS", "Schiphol", "Amsterdam", "Netherlands", -11), ("FCO", "Fiumicino", "Rome", "Italy", 13),
    ("ATH", "Eleftherios Venizelos", "Athens", "Greece", 308), ("IST", "Istanbul", "Istanbul", "Turkey", 325),
    ("JFK", "John F. Kennedy", "New York", "USA", 13), ("LAX", "Los Angeles", "Los Angeles", "USA", 125),
    ("ORD", "O'Hare", "Chicago", "USA", 672), ("DEN", "Denver", "Denver", "USA", 5434),
    ("YYZ", "Pearson", "Toronto", "Canada", 569), ("MEX", "Benito Juarez", "Mexico City", "Mexico", 7316),
    ("GRU", "Guarulhos", "Sao Paulo", "Brazil", 2459), ("EZE", "Ezeiza", "Buenos Aires", "Argentina", 67),
    ("NRT", "Narita", "Tokyo", "Japan", 141), ("HND", "Haneda", "Tokyo", "Japan", 35),
    ("ICN", "Incheon", "Seoul", "South Korea", 23), ("SIN", "Changi", "Singapore", "Singapore", 22),
    ("DXB", "Dubai", "Dubai", "UAE", 62), ("DOH", "Hamad", "Doha", "Qatar", 13),
    ("JNB", "O. R. Tambo", "Johannesburg", "South Africa", 5558), ("LOS", "Murtala Muhammed", "Lagos", "Nigeria", 135),
    ("SYD", "Kingsford Smith", "Sydney", "Australia", 21), ("BOM", "Chhatrapati Shivaji", "Mumbai", "India", 37),
)  # fmt: skip
_AIRLINES = (
    ("Atlantic Wings", "AW", "Portugal"), ("Boreal Air", "BR", "Canada"), ("Cobalt Airways", "CB", "UK"),
    ("Dune Air", "DN", "UAE"), ("Equator Lines", "EQ", "Brazil"), ("Fjord Flyers", "FJ", "Norway"),
    ("Golden Gate Air", "GG", "USA"), ("Himalaya Jet", "HJ", "India"), ("Iberic Sky", "IS", "Spain"),
    ("Jade Pacific", "JP", "Japan"), ("Kestrel Air", "KS", "Germany"), ("Lagoon Airways", "LG", "Italy"),
    ("Meridian Air", "MR", "France"), ("Nimbus Express", "NX", "Netherlands"), ("Orbit Airlines", "OR", "USA"),
    ("Pampas Air", "PA", "Argentina"), ("Quokka Air", "QK", "Australia"), ("Savanna Air", "SV", "Nigeria"),
    ("Tiger Straits", "TS", "Singapore"), ("Union Skies", "US", "Turkey"),
)  # fmt: skip


def _flights(rng: random.Random) -> Tables:
    airports = list(_AIRPORTS)
    airlines = [(i, name, code, country) for i, (name, code, country) in enumerate(_AIRLINES, start=1)]
    flights: list[Row] = []
    for i in range(1, 151):
        airline_id = rng.randint(1, 20)
        origin, destination = rng.sample([a[0] for a in airports], 2)
        distance = rng.randint(300, 12_000)
        departure = f"{_day(rng, 120)} {rng.randint(5, 22):02d}:{rng.choice((0, 15, 30, 45)):02d}"
        status = rng.choice(("on time", "on time", "on time", "delayed", "cancelled"))
        number = f"{airlines[airline_id - 1][2]}{rng.randint(100, 999)}"
        flights.append((i, number, airline_id, origin, destination, departure, 30 + distance // 13, distance, status))
    passengers = [(i, _person(rng), rng.choice(_COUNTRIES), rng.randint(1945, 2010)) for i in range(1, 101)]
    fares = {"economy": 1.0, "premium": 1.8, "business": 3.5}
    bookings = []
    for i in range(1, 201):
        flight = flights[rng.randrange(len(flights))]
        fare_class = rng.choice(("economy", "economy", "economy", "premium", "business"))
        price = round((40 + flight[7] * 0.09) * fares[fare_class] * rng.uniform(0.85, 1.25), 2)
        bookings.append((i, flight[0], rng.randint(1, 100), fare_class, price))
    return {
        "airports": airports,
        "airlines": airlines,
        "flights": flights,
        "passengers": passengers,
        "bookings": bookings,
    }


_BUILDERS: dict[str, tuple[str, Callable[[random.Random], Tables]]] = {
    "bookstore": (_BOOKSTORE_SCHEMA, _bookstore),
    "school": (_SCHOOL_SCHEMA, _school),
    "flights": (_FLIGHTS_SCHEMA, _flights),
}

# --- questions ---------------------------------------------------------------------------------------------------

QUESTIONS: tuple[tuple[str, str, str], ...] = (
    # (db_id, question, gold SQL)
    ("bookstore", "How many books are in the catalogue?", "SELECT COUNT(*) FROM books"),
    (
        "bookstore",
        "List the titles of the five most expensive books.",
        "SELECT title FROM books ORDER BY price DESC, book_id LIMIT 5",
    ),
    (
        "bookstore",
        "What is the average price of a book in each genre?",
        "SELECT genre, AVG(price) FROM books GROUP BY genre",
    ),
    (
        "bookstore",
        "Which authors have no recorded birth year?",
        "SELECT name FROM authors WHERE birth_year IS NULL",
    ),
    (
        "bookstore",
        "How many books has each author from Japan written?",
        "SELECT a.name, COUNT(b.book_id) FROM authors a JOIN books b ON b.author_id = a.author_id "
        "WHERE a.country = 'Japan' GROUP BY a.author_id",
    ),
    (
        "bookstore",
        "Which books are out of stock?",
        "SELECT title FROM books WHERE stock = 0",
    ),
    (
        "bookstore",
        "How many orders does each status have?",
        "SELECT status, COUNT(*) FROM orders GROUP BY status",
    ),
    (
        "bookstore",
        "What is the total revenue of shipped orders?",
        "SELECT SUM(oi.quantity * oi.unit_price) FROM order_items oi JOIN orders o ON o.order_id = oi.order_id "
        "WHERE o.status = 'shipped'",
    ),
    (
        "bookstore",
        "Which customers from Lisbon have placed at least one order?",
        "SELECT DISTINCT c.name FROM customers c JOIN orders o ON o.customer_id = c.customer_id "
        "WHERE c.city = 'Lisbon'",
    ),
    (
        "bookstore",
        "Which genre has sold the most copies?",
        "SELECT b.genre FROM order_items oi JOIN books b ON b.book_id = oi.book_id "
        "GROUP BY b.genre ORDER BY SUM(oi.quantity) DESC, b.genre LIMIT 1",
    ),
    (
        "bookstore",
        "How many customers joined in each city?",
        "SELECT city, COUNT(*) FROM customers GROUP BY city",
    ),
    (
        "bookstore",
        "List the books published before 1980 together with their author's name.",
        "SELECT b.title, a.name FROM books b JOIN authors a ON a.author_id = b.author_id WHERE b.published_year < 1980",
    ),
    ("school", "How many students are enrolled at the school?", "SELECT COUNT(*) FROM students"),
    (
        "school",
        "What is the average GPA of students in each enrollment year?",
        "SELECT enrollment_year, AVG(gpa) FROM students GROUP BY enrollment_year",
    ),
    (
        "school",
        "Which departments are located in North Hall?",
        "SELECT name FROM departments WHERE building = 'North Hall'",
    ),
    (
        "school",
        "Who is the highest-paid teacher?",
        "SELECT name FROM teachers ORDER BY salary DESC, teacher_id LIMIT 1",
    ),
    (
        "school",
        "How many courses does each department offer?",
        "SELECT d.name, COUNT(c.course_id) FROM departments d JOIN courses c ON c.dept_id = d.dept_id "
        "GROUP BY d.dept_id",
    ),
    (
        "school",
        "Which students have not declared a major?",
        "SELECT name FROM students WHERE major_dept_id IS NULL",
    ),
    (
        "school",
        "List the codes of courses worth 4 credits.",
        "SELECT code FROM courses WHERE credits = 4",
    ),
    (
        "school",
        "How many enrollments are still in progress (no grade yet)?",
        "SELECT COUNT(*) FROM enrollments WHERE grade IS NULL",
    ),
    (
        "school",
        "Which students received an A, and in which course?",
        "SELECT s.name, c.title FROM enrollments e JOIN students s ON s.student_id = e.student_id "
        "JOIN courses c ON c.course_id = e.course_id WHERE e.grade = 'A'",
    ),
    (
        "school",
        "What is the average teacher salary per department?",
        "SELECT d.name, AVG(t.salary) FROM teachers t JOIN departments d ON d.dept_id = t.dept_id GROUP BY d.dept_id",
    ),
    (
        "school",
        "Which teachers teach more than one course?",
        "SELECT t.name FROM teachers t JOIN courses c ON c.teacher_id = t.teacher_id "
        "GROUP BY t.teacher_id HAVING COUNT(*) > 1",
    ),
    (
        "school",
        "What is the largest department budget?",
        "SELECT MAX(budget) FROM departments",
    ),
    ("flights", "How many airports are in the database?", "SELECT COUNT(*) FROM airports"),
    (
        "flights",
        "Which airports are in the USA?",
        "SELECT name FROM airports WHERE country = 'USA'",
    ),
    (
        "flights",
        "How many flights does each airline operate?",
        "SELECT al.name, COUNT(f.flight_id) FROM airlines al JOIN flights f ON f.airline_id = al.airline_id "
        "GROUP BY al.airline_id",
    ),
    (
        "flights",
        "List the flight numbers of cancelled flights.",
        "SELECT flight_number FROM flights WHERE status = 'cancelled'",
    ),
    (
        "flights",
        "What is the longest flight by distance, and where does it go from and to?",
        "SELECT flight_number, origin, destination FROM flights ORDER BY distance_km DESC, flight_id LIMIT 1",
    ),
    (
        "flights",
        "What is the average booking price for each fare class?",
        "SELECT fare_class, AVG(price) FROM bookings GROUP BY fare_class",
    ),
    (
        "flights",
        "How many flights depart from each city?",
        "SELECT a.city, COUNT(*) FROM flights f JOIN airports a ON a.airport_code = f.origin GROUP BY a.city",
    ),
    (
        "flights",
        "Which passengers have booked a business-class seat?",
        "SELECT DISTINCT p.name FROM bookings b JOIN passengers p ON p.passenger_id = b.passenger_id "
        "WHERE b.fare_class = 'business'",
    ),
    (
        "flights",
        "What is the highest-elevation airport?",
        "SELECT name FROM airports ORDER BY elevation_ft DESC LIMIT 1",
    ),
    (
        "flights",
        "How much revenue did each airline make from bookings?",
        "SELECT al.name, SUM(b.price) FROM bookings b JOIN flights f ON f.flight_id = b.flight_id "
        "JOIN airlines al ON al.airline_id = f.airline_id GROUP BY al.airline_id",
    ),
    (
        "flights",
        "Which flights are delayed and longer than 6 hours?",
        "SELECT flight_number FROM flights WHERE status = 'delayed' AND duration_min > 360",
    ),
    (
        "flights",
        "How many passengers were born before 1970?",
        "SELECT COUNT(*) FROM passengers WHERE birth_year < 1970",
    ),
)
"""The bundled questions: ``(db_id, question, gold SQL)``. Every gold query returns at least one row."""


def _insert(conn: sqlite3.Connection, table: str, rows: Sequence[Row]) -> None:
    placeholders = ", ".join("?" for _ in rows[0])
    conn.executemany(f"INSERT INTO {table} VALUES ({placeholders})", rows)


def build_database(db_id: str, db_file: pathlib.Path, seed: int = DEFAULT_SEED) -> None:
    """Create ``db_file`` (replacing any existing file) holding database ``db_id`` generated from ``seed``.

    Raises:
        KeyError: ``db_id`` is not one of :data:`DB_IDS`.
    """
    schema, generate = _BUILDERS[db_id]
    # One generator per database, seeded from (seed, db_id), so each database is independent of the others.
    tables = generate(random.Random(f"{seed}:{db_id}"))
    db_file.parent.mkdir(parents=True, exist_ok=True)
    db_file.unlink(missing_ok=True)
    conn = sqlite3.connect(db_file)
    try:
        # Fixed page size and a rollback journal keep the file layout independent of local SQLite defaults.
        conn.execute("PRAGMA page_size = 4096")
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.executescript(schema)
        with conn:
            for table, rows in tables.items():
                _insert(conn, table, rows)
        conn.execute("VACUUM")
    finally:
        conn.close()


def write_questions(path: pathlib.Path) -> None:
    """Write :data:`QUESTIONS` as JSON lines ``{"db_id", "question", "sql"}``."""
    lines = [json.dumps({"db_id": d, "question": q, "sql": s}, ensure_ascii=False) for d, q, s in QUESTIONS]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def build_all(out_dir: pathlib.Path, seed: int = DEFAULT_SEED) -> None:
    """Write every bundled database and the questions file under ``out_dir`` (layout in the module docstring)."""
    for db_id in DB_IDS:
        build_database(db_id, out_dir / "databases" / db_id / f"{db_id}.sqlite", seed)
    write_questions(out_dir / "questions.jsonl")


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent, help="output directory")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    build_all(args.out, args.seed)


if __name__ == "__main__":
    main()
