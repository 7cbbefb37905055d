wc -l < /workspace/data.txt > /workspace/answer.txt
