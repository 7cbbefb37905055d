sqlite3 /workspace/shop.db <<'SQL'
UPDATE products SET price = ROUND(price * (100 + {{ pct }}) / 100.0, 2) WHERE category = '{{ category }}';
UPDATE orders SET status = 'cancelled'
 WHERE status = 'pending' AND created < '{{ cutoff }}'
   AND customer_id IN (SELECT id FROM customers WHERE tier = 'basic');
SQL
