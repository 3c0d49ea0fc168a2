"""pg_waldump's records per payment made, by table (its indexes with it) and by relation and kind.

    wal_by_relation.py RECORDS RELATIONS MADE

RECORDS: pg_waldump's plain output; RELATIONS: lines of `filenode relname`; MADE: payments made.
"""
import collections
import re
import sys

TABLES = ("audit_records", "idempotency_keys", "payments", "refunds", "staged_jobs", "accounts")

records, relations, made = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = dict(line.strip().split(" ", 1) for line in open(relations) if " " in line.strip())
bytes_by, count_by = collections.Counter(), collections.Counter()
for line in open(records):
    size = re.search(r"len \(rec/tot\):\s*\d+/\s*(\d+)", line)
    if not size:
        continue
    manager = re.search(r"rmgr: (\w+)", line).group(1)
    relation = re.search(r"rel \d+/\d+/(\d+)", line)
    kind = re.search(r"desc: (\w+)", line)
    name = names.get(relation.group(1), relation.group(1)) if relation else "-"
    key = f"{name} {manager} {kind.group(1) if kind else ''}"
    bytes_by[key] += int(size.group(1))
    count_by[key] += 1


def table(key):
    name = key.split(" ")[0]
    if name == "-":
        return "commits, MultiXacts"
    return next((t for t in TABLES if name.startswith(t)), "other")


by_table = collections.Counter()
for key, size in bytes_by.items():
    by_table[table(key)] += size
print(f"by records: {sum(bytes_by.values()) / made:.0f} bytes per payment")
for name, size in by_table.most_common():
    print(f"  {size / made:7.0f}  {name}")
print("by relation and kind (at least 5 bytes per payment): bytes, records per payment")
for key, size in bytes_by.most_common():
    if size / made >= 5:
        print(f"  {size / made:7.0f}  {count_by[key] / made:5.2f}  {key}")
