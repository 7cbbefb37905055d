set -e
agentenv-pg-start
psql -h /tmp -d shop -q -v ON_ERROR_STOP=1 <<'SQL'
UPDATE customers SET loyalty = 'gold'
 WHERE id IN (SELECT customer_id FROM orders GROUP BY customer_id HAVING COUNT(*) >= {{ threshold }});
UPDATE items SET stock = stock + {{ restock }} WHERE stock < 5;
SQL
