sqlite3 /workspace/shop.db "SELECT COUNT(*) FROM orders WHERE status = 'pending'" > /workspace/answer.txt
