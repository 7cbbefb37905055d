answer=$(awk '$2 == "{{ level }}" { sub(":", "", $3); n[$3]++ } END { for (s in n) print n[s], s }' /workspace/logs/app.log \
  | sort -k1,1nr | head -n1 | awk '{ print $2, $1 }')
echo "$answer" > /workspace/answer.txt
echo "$answer"
